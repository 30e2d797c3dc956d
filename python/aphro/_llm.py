"""The coupled OpenAI routes in process: :class:`LLM` and :class:`AsyncLLM`."""
from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any, AsyncIterator, Dict, Iterator, Optional

from ._aphro import CoupledServing, Derenderer, Engine, Renderer

__all__ = ["LLM", "AsyncLLM"]

JSON = Dict[str, Any]


class LLM:
    """``/v1/chat/completions`` and ``/v1/completions`` as methods: render, engine and
    derender chained in this process by the same Rust type the integrated server (``aphro
    serve``) runs, so a request returns the same response, and streams the same chunks, as it
    does over HTTP.

    >>> llm = LLM()                                                     # doctest: +SKIP
    >>> llm.chat({"messages": [{"role": "user", "content": "Hi"}]})     # doctest: +SKIP
    >>> for chunk in llm.chat_stream({"messages": [...], "stream": True}):  # doctest: +SKIP
    ...     print(chunk["choices"][0]["delta"].get("content", ""), end="")

    Args:
        model: as for :class:`Engine` (``None`` = the embedded default model).
        chat_template, tool_call_parser, reasoning_parser, enable_auto_tool_choice: as the
            server flags of the same names (the renderer's and the derenderer's).
        **engine_args: as for :class:`Engine` (``max_model_len``, ``kv_cache_memory``,
            ``served_model_name``, ...).
    """

    def __init__(
        self,
        model: Any = None,
        *,
        chat_template: Optional[str] = None,
        tool_call_parser: Optional[str] = None,
        reasoning_parser: Optional[str] = None,
        enable_auto_tool_choice: bool = False,
        **engine_args: Any,
    ) -> None:
        self.engine = Engine(model, **engine_args)
        # The renderer and derenderer share the tokenizer side the engine loaded.
        shared = self.engine.model
        if shared is not None:
            model = shared
        name = self.engine.served_model_name
        max_model_len = self.engine.max_model_len
        parsers = dict(
            tool_call_parser=tool_call_parser,
            reasoning_parser=reasoning_parser,
            enable_auto_tool_choice=enable_auto_tool_choice,
        )
        self.renderer = Renderer(
            model,
            chat_template=chat_template,
            max_model_len=max_model_len,
            served_model_name=name,
            **parsers,
        )
        self.derenderer = Derenderer(
            model, served_model_name=name, max_model_len=max_model_len, **parsers
        )
        self._coupled = CoupledServing(self.engine, self.renderer, self.derenderer)

    def chat(self, request: JSON, *, request_id: Optional[str] = None) -> JSON:
        """The ``chat.completion`` response of a chat request (``stream`` is ignored)."""
        return self._coupled.chat(request, request_id=request_id)

    def chat_stream(self, request: JSON, *, request_id: Optional[str] = None) -> Iterator[JSON]:
        """The ``chat.completion.chunk`` objects of a chat request, as the SSE stream's
        ``data:`` events. Closing the iterator early aborts the request."""
        return self._coupled.chat_stream(request, request_id=request_id)

    def completion(self, request: JSON, *, request_id: Optional[str] = None) -> JSON:
        """The ``text_completion`` response of a completion request."""
        return self._coupled.completion(request, request_id=request_id)

    def completion_stream(
        self, request: JSON, *, request_id: Optional[str] = None
    ) -> Iterator[JSON]:
        """The ``text_completion`` chunks of a completion request."""
        return self._coupled.completion_stream(request, request_id=request_id)

    @property
    def served_model_name(self) -> str:
        return self.engine.served_model_name

    def shutdown(self) -> None:
        self.engine.shutdown()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


class AsyncLLM:
    """:class:`LLM` for asyncio code: the streams are async iterators whose waits run in
    worker threads with the GIL released, so the event loop never blocks; many requests run
    concurrently and the engine batches them.

    >>> llm = AsyncLLM()                                        # doctest: +SKIP
    >>> async for chunk in llm.chat_stream(request):            # doctest: +SKIP
    ...     ...

    Args:
        max_concurrency: worker threads waiting on streams (default 256).
        Other arguments: as for :class:`LLM`.
    """

    def __init__(self, model: Any = None, *, max_concurrency: int = 256, **kwargs: Any) -> None:
        self.llm = LLM(model, **kwargs)
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=max_concurrency, thread_name_prefix="aphro-llm-wait"
        )

    async def _drain(self, open_stream: Any) -> AsyncIterator[JSON]:
        loop = asyncio.get_running_loop()
        stream = await loop.run_in_executor(self._pool, open_stream)
        finished = False
        try:
            while True:
                chunk = await loop.run_in_executor(self._pool, stream.next_chunk)
                if chunk is None:
                    finished = True
                    return
                yield chunk
        finally:
            if not finished:
                stream.close()

    async def chat(self, request: JSON, *, request_id: Optional[str] = None) -> JSON:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._pool, lambda: self.llm.chat(request, request_id=request_id)
        )

    def chat_stream(
        self, request: JSON, *, request_id: Optional[str] = None
    ) -> AsyncIterator[JSON]:
        """Async iterator over the chunks of a chat request; leaving the ``async for`` early
        aborts the request."""
        return self._drain(lambda: self.llm.chat_stream(request, request_id=request_id))

    async def completion(self, request: JSON, *, request_id: Optional[str] = None) -> JSON:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._pool, lambda: self.llm.completion(request, request_id=request_id)
        )

    def completion_stream(
        self, request: JSON, *, request_id: Optional[str] = None
    ) -> AsyncIterator[JSON]:
        return self._drain(lambda: self.llm.completion_stream(request, request_id=request_id))

    def shutdown(self) -> None:
        self.llm.shutdown()
        self._pool.shutdown(wait=False)

    async def __aenter__(self) -> "AsyncLLM":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.shutdown()
