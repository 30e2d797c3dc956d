"""Exceptions raised by aphro: the same fields as the HTTP routes' error bodies."""
from __future__ import annotations

from typing import Any, Dict, Optional

__all__ = ["AphroError", "BadRequestError", "NotFoundError", "InternalServerError"]


class AphroError(Exception):
    """Base class of aphro's errors.

    ``str(err)`` / ``err.message`` is the ``error.message`` of the HTTP error body, ``err.type``
    its ``error.type`` (``"Bad Request"`` for structural validation, ``"BadRequestError"`` for
    vLLM's semantic checks, ...), ``err.param`` its ``error.param`` and ``err.status`` the HTTP
    status code (``error.code``).
    """

    default_status = 500
    default_type = "InternalServerError"

    def __init__(
        self,
        message: str,
        *,
        status: Optional[int] = None,
        type: Optional[str] = None,  # noqa: A002 - the wire field's name
        param: Optional[str] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = self.default_status if status is None else status
        self.type = self.default_type if type is None else type
        self.param = param

    @property
    def code(self) -> int:
        """Alias of :attr:`status` (the envelope's ``code``)."""
        return self.status

    def to_dict(self) -> Dict[str, Any]:
        """vLLM's error envelope ``{"error": {"message", "type", "param", "code"}}``."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.status,
            }
        }

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.message!r}, status={self.status}, "
            f"type={self.type!r}, param={self.param!r})"
        )

    def __reduce__(self):  # keep the fields across pickling (multiprocessing, Ray)
        return (
            _rebuild,
            (type(self), self.message, self.status, self.type, self.param),
        )


def _rebuild(cls, message, status, type_, param):
    return cls(message, status=status, type=type_, param=param)


class BadRequestError(AphroError):
    """HTTP 400: the request is invalid (validation, template errors, prompt too long)."""

    default_status = 400
    default_type = "BadRequestError"


class NotFoundError(AphroError):
    """HTTP 404: e.g. the request names a model that is not served."""

    default_status = 404
    default_type = "NotFoundError"


class InternalServerError(AphroError):
    """HTTP 5xx: model files, tokenizer or engine failures."""

    default_status = 500
    default_type = "InternalServerError"
