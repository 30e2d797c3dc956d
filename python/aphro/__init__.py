"""aphro: vLLM-compatible LLM serving in Rust, from Python.

The three stages of a request, each usable on its own or chained in one process:

* :class:`Renderer` -- OpenAI chat / completion request -> token-in ``GenerateRequest``
  (chat template + tokenizer), exactly as ``/v1/chat/completions/render`` does;
* :class:`Engine` / :class:`AsyncEngine` -- ``GenerateRequest`` -> generated token ids
  (``/inference/v1/generate``), on the Rust engine, GIL released while it works;
* :class:`Derenderer` -- generated token ids -> ``chat.completion`` / ``text_completion``
  (detokenizer, stop strings, reasoning and tool-call parsers), as ``.../derender`` does;
* :class:`LLM` / :class:`AsyncLLM` -- the three chained, as ``/v1/chat/completions`` and
  ``/v1/completions`` of ``aphro serve`` (same responses, same stream chunks);
* :class:`Embedder` -- a pooling model (e.g. all-MiniLM-L6-v2): ``embed``, ``score``,
  ``rerank``, ``classify`` as the pooling routes compute them.

Every method takes and returns plain dicts with the JSON shapes of the HTTP routes; errors
raise :class:`AphroError` subclasses carrying the HTTP error body's fields.

``model=None`` everywhere means the embedded default model, SmolLM2-135M-Instruct (Q4_1 GGUF).
"""
from __future__ import annotations

import functools
import os
from typing import Any, Dict, List, Optional, Sequence, Union

from .cli import serve
from ._errors import AphroError, BadRequestError, InternalServerError, NotFoundError
from ._aphro import (
    ChatStream,
    CompletionStream,
    Derenderer,
    Model,
    Parser,
    Renderer,
    __version__,
    default_model_path,
    parse,
)

try:  # the serving engine (aphro-engine); absent from builds without it
    from ._aphro import ChunkStream, CoupledServing, Embedder, Engine, EngineStream  # noqa: F401
    from ._aphro import Transcriber  # noqa: F401
    from ._engine import AsyncEngine  # noqa: F401
    from ._llm import LLM, AsyncLLM  # noqa: F401

    _HAS_ENGINE = True
except ImportError:  # pragma: no cover - depends on the build
    _HAS_ENGINE = False

__all__ = [
    "AphroError",
    "BadRequestError",
    "NotFoundError",
    "InternalServerError",
    "Model",
    "Renderer",
    "Derenderer",
    "ChatStream",
    "CompletionStream",
    "Parser",
    "parse",
    "tokenize",
    "detokenize",
    "default_model_path",
    "serve",
    "__version__",
]
if _HAS_ENGINE:
    __all__ += [
        "Engine",
        "EngineStream",
        "AsyncEngine",
        "LLM",
        "AsyncLLM",
        "ChunkStream",
        "Embedder",
        "Transcriber",
    ]

ModelLike = Union[None, str, "os.PathLike[str]", Model]


def _model_key(model: ModelLike) -> Optional[str]:
    if model is None:
        return None
    if isinstance(model, Model):
        return model.path
    return os.fspath(model)


@functools.lru_cache(maxsize=8)
def _renderer(key: Optional[str]) -> Renderer:
    return Renderer(key)


def tokenize(
    prompt: Union[str, Sequence[Dict[str, Any]]],
    *,
    model: ModelLike = None,
    add_special_tokens: Optional[bool] = None,
    add_generation_prompt: bool = True,
    **kwargs: Any,
) -> List[int]:
    """Token ids of ``prompt`` (a string) or of a chat (a list of messages, rendered with the
    model's chat template), as the ``/tokenize`` route computes them.

    ``add_special_tokens`` defaults to the route's default (true for a prompt, false for
    messages). Extra keyword arguments go into the request (``chat_template_kwargs``,
    ``tools``, ``continue_final_message``, ...).
    """
    if isinstance(prompt, str):
        req: Dict[str, Any] = {"prompt": prompt}
    else:
        req = {"messages": list(prompt), "add_generation_prompt": add_generation_prompt}
    if add_special_tokens is not None:
        req["add_special_tokens"] = add_special_tokens
    req.update(kwargs)
    return _renderer(_model_key(model)).tokenize(req)["tokens"]


def detokenize(token_ids: Sequence[int], *, model: ModelLike = None) -> str:
    """Text of ``token_ids`` (the ``/detokenize`` route)."""
    return _renderer(_model_key(model)).detokenize({"tokens": list(token_ids)})["prompt"]
