"""asyncio front of the engine: :class:`AsyncEngine`."""
from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any, AsyncIterator, Dict, Optional, Sequence, Union

from ._aphro import Engine

__all__ = ["AsyncEngine"]


class AsyncEngine:
    """The engine for asyncio code (gateways, Ray Serve / Dynamo workers).

    ``generate`` is an async iterator over the stream events of one request; many requests
    run concurrently and are batched by the engine. Waiting for the next event happens in a
    worker thread with the GIL released, so the event loop never blocks.

    >>> engine = AsyncEngine()                         # doctest: +SKIP
    >>> async for event in engine.generate(request):   # doctest: +SKIP
    ...     print(event["choices"][0]["token_ids"])

    Args:
        model: as for :class:`Engine`.
        max_concurrency: worker threads waiting on streams (default 256): the number of
            requests whose events can be awaited at the same time.
        **engine_args: as for :class:`Engine`.
    """

    def __init__(self, model: Any = None, *, max_concurrency: int = 256, **engine_args: Any) -> None:
        self.engine = Engine(model, **engine_args)
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=max_concurrency, thread_name_prefix="aphro-engine-wait"
        )

    async def generate(
        self,
        request: Dict[str, Any],
        *,
        request_id: Optional[str] = None,
        session_id: Optional[str] = None,
    ) -> AsyncIterator[Dict[str, Any]]:
        """Async iterator over the stream events of ``request`` (a ``GenerateRequest`` dict).

        Leaving the ``async for`` early (``break``, an exception, task cancellation) aborts
        the request in the engine.
        """
        loop = asyncio.get_running_loop()
        stream = await loop.run_in_executor(
            self._pool,
            lambda: self.engine.generate_stream(
                request, request_id=request_id, session_id=session_id
            ),
        )
        finished = False
        try:
            while True:
                event = await loop.run_in_executor(self._pool, stream.next_event)
                if event is None:
                    finished = True
                    return
                yield event
        finally:
            if not finished:
                stream.abort()

    async def generate_full(
        self,
        request: Dict[str, Any],
        *,
        request_id: Optional[str] = None,
        session_id: Optional[str] = None,
    ) -> Dict[str, Any]:
        """The whole ``GenerateResponse`` of ``request`` (non-streaming)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._pool,
            lambda: self.engine.generate(request, request_id=request_id, session_id=session_id),
        )

    def abort(self, request_id: Union[str, Sequence[str]]) -> None:
        """Aborts requests by id (see :meth:`Engine.abort`)."""
        self.engine.abort(request_id)

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def served_model_name(self) -> str:
        return self.engine.served_model_name

    def shutdown(self) -> None:
        """Stops the engine and the wait threads."""
        self.engine.shutdown()
        self._pool.shutdown(wait=False)

    async def __aenter__(self) -> "AsyncEngine":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.shutdown()
