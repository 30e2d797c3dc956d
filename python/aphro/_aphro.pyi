"""Type stubs of the native extension ``aphro._aphro`` (import from ``aphro``)."""
from __future__ import annotations

import os
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

JSON = Dict[str, Any]
ModelLike = Union[None, str, "os.PathLike[str]", "Model"]

__version__: str

def default_model_path() -> str: ...
def parse(
    model_output: str,
    *,
    tool_call_parser: Optional[str] = None,
    reasoning_parser: Optional[str] = None,
    tools: Optional[List[JSON]] = None,
    tool_choice: Union[None, str, JSON] = None,
    parallel_tool_calls: bool = True,
    chat_template_kwargs: Optional[JSON] = None,
    prompt_text: Optional[str] = None,
    history_tool_calls: int = 0,
) -> JSON: ...
def _bench_render_chat(
    renderer: Renderer, request: JSON, iterations: int, *, parse_each: bool = False
) -> float: ...

class Model:
    def __init__(self, model: ModelLike = None) -> None: ...
    @property
    def name(self) -> str: ...
    @property
    def path(self) -> str: ...
    @property
    def max_model_len(self) -> Optional[int]: ...
    @property
    def eos_token_ids(self) -> List[int]: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def chat_template(self) -> Optional[str]: ...
    @property
    def model_type(self) -> Optional[str]: ...
    def encode(self, text: str, *, add_special_tokens: bool = True) -> List[int]: ...
    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = False) -> str: ...

class Renderer:
    def __init__(
        self,
        model: ModelLike = None,
        *,
        chat_template: Optional[str] = None,
        chat_template_content_format: str = "auto",
        max_model_len: Optional[int] = None,
        default_chat_template_kwargs: Optional[JSON] = None,
        served_model_name: Union[None, str, Sequence[str]] = None,
        tool_call_parser: Optional[str] = None,
        reasoning_parser: Optional[str] = None,
        enable_auto_tool_choice: bool = False,
        trust_request_mm_kwargs: bool = False,
        mm_device_do_normalize: bool = True,
        allowed_media_domains: Optional[Sequence[str]] = None,
        allowed_local_media_path: Optional[str] = None,
    ) -> None: ...
    @property
    def model(self) -> Model: ...
    @property
    def max_model_len(self) -> int: ...
    def render_chat(self, request: JSON, *, request_id: Optional[str] = None) -> JSON: ...
    def render_completion(
        self, request: JSON, *, request_id: Optional[str] = None
    ) -> List[JSON]: ...
    def tokenize(self, request: Union[str, JSON]) -> JSON: ...
    def detokenize(self, request: Union[Sequence[int], JSON]) -> JSON: ...

class ChatStream:
    def push(self, chunk: JSON) -> JSON: ...
    @property
    def tokens(self) -> int: ...

class CompletionStream:
    def push(self, chunk: JSON) -> JSON: ...

class Derenderer:
    def __init__(
        self,
        model: ModelLike = None,
        *,
        tool_call_parser: Optional[str] = None,
        reasoning_parser: Optional[str] = None,
        enable_auto_tool_choice: bool = False,
        served_model_name: Optional[str] = None,
        max_model_len: Optional[int] = None,
        max_logprobs: int = 20,
        return_tokens_as_token_ids: bool = False,
    ) -> None: ...
    @property
    def model(self) -> Model: ...
    @property
    def served_model_name(self) -> str: ...
    def derender_chat(
        self,
        response: JSON,
        chat_request: Optional[JSON] = None,
        *,
        prompt_token_ids: Optional[Sequence[int]] = None,
        prompt_tokens: Optional[int] = None,
        model: Optional[str] = None,
    ) -> JSON: ...
    def derender_completion(
        self,
        responses: Union[JSON, List[JSON]],
        completion_request: Optional[JSON] = None,
        *,
        prompt_token_ids: Union[None, Sequence[int], Sequence[Optional[Sequence[int]]]] = None,
        prompt_tokens: Union[None, int, Sequence[int]] = None,
        model: Optional[str] = None,
    ) -> JSON: ...
    def chat_stream(
        self,
        chat_request: Optional[JSON] = None,
        *,
        prompt_token_ids: Optional[Sequence[int]] = None,
        prompt_tokens: Optional[int] = None,
        request_id: str = "",
        index: int = 0,
    ) -> ChatStream: ...
    def completion_stream(
        self,
        completion_request: Optional[JSON] = None,
        *,
        prompt_token_ids: Optional[Sequence[int]] = None,
        prompt_tokens: Optional[int] = None,
        request_id: str = "",
        index: int = 0,
    ) -> CompletionStream: ...

class Parser:
    def __init__(
        self,
        *,
        tool_call_parser: Optional[str] = None,
        reasoning_parser: Optional[str] = None,
        tools: Optional[List[JSON]] = None,
        tool_choice: Union[None, str, JSON] = None,
        parallel_tool_calls: bool = True,
        chat_template_kwargs: Optional[JSON] = None,
        prompt_text: Optional[str] = None,
        history_tool_calls: int = 0,
    ) -> None: ...
    def push(self, text: str) -> JSON: ...
    def finish(self) -> JSON: ...

class Embedder:
    """A pooling model (HF encoder folder): the pooling routes' computations in process."""

    def __init__(self, model_dir: Union[str, "os.PathLike[str]"]) -> None: ...
    @property
    def max_model_len(self) -> int: ...
    @property
    def task(self) -> str: ...
    def embed(
        self,
        texts: Union[str, Sequence[Union[str, Sequence[int]]]],
        *,
        dimensions: Optional[int] = None,
        normalize: Optional[bool] = None,
        truncate_prompt_tokens: Optional[int] = None,
        truncation_side: Optional[str] = None,
    ) -> Union[List[float], List[List[float]]]: ...
    def score(
        self,
        queries: Union[str, Sequence[str]],
        documents: Union[str, Sequence[str]],
        *,
        use_activation: Optional[bool] = None,
        truncate_prompt_tokens: Optional[int] = None,
        truncation_side: Optional[str] = None,
    ) -> List[float]: ...
    def rerank(
        self,
        query: str,
        documents: Sequence[str],
        *,
        top_n: int = 0,
        use_activation: Optional[bool] = None,
        truncate_prompt_tokens: Optional[int] = None,
        truncation_side: Optional[str] = None,
    ) -> List[JSON]: ...
    def classify(
        self,
        texts: Union[str, Sequence[Union[str, Sequence[int]]]],
        *,
        use_activation: Optional[bool] = None,
        truncate_prompt_tokens: Optional[int] = None,
        truncation_side: Optional[str] = None,
    ) -> List[JSON]: ...

class EngineStream:
    @property
    def request_id(self) -> str: ...
    def __iter__(self) -> Iterator[JSON]: ...
    def __next__(self) -> JSON: ...
    def next_event(self) -> Optional[JSON]: ...
    def abort(self) -> None: ...
    def close(self) -> None: ...

class Engine:
    def __init__(self, model: ModelLike = None, **engine_args: Any) -> None: ...
    def generate(
        self, request: JSON, *, request_id: Optional[str] = None, session_id: Optional[str] = None
    ) -> JSON: ...
    def generate_stream(
        self, request: JSON, *, request_id: Optional[str] = None, session_id: Optional[str] = None
    ) -> EngineStream: ...
    def abort(self, request_id: Union[str, Sequence[str]]) -> None: ...
    @property
    def served_model_name(self) -> str: ...
    @property
    def max_model_len(self) -> int: ...
    @property
    def model_path(self) -> str: ...
    @property
    def model(self) -> Optional[Model]: ...
    def is_healthy(self) -> bool: ...
    def shutdown(self) -> None: ...
    def __enter__(self) -> Engine: ...
    def __exit__(self, *exc: Any) -> None: ...

class ChunkStream:
    def __iter__(self) -> Iterator[JSON]: ...
    def __next__(self) -> JSON: ...
    def next_chunk(self) -> Optional[JSON]: ...
    def close(self) -> None: ...

class CoupledServing:
    def __init__(self, engine: Engine, renderer: Renderer, derenderer: Derenderer) -> None: ...
    def chat(self, request: JSON, *, request_id: Optional[str] = None) -> JSON: ...
    def chat_stream(self, request: JSON, *, request_id: Optional[str] = None) -> ChunkStream: ...
    def completion(self, request: JSON, *, request_id: Optional[str] = None) -> JSON: ...
    def completion_stream(
        self, request: JSON, *, request_id: Optional[str] = None
    ) -> ChunkStream: ...

class Transcriber:
    """Speech to text on a Whisper folder (the bodies of ``/v1/audio/transcriptions``)."""

    def __init__(
        self,
        model_dir: Union[str, "os.PathLike[str]"],
        num_threads: Optional[int] = None,
        device: str = "auto",
    ) -> None: ...
    def transcribe(
        self,
        audio: Union[bytes, str, "os.PathLike[str]"],
        *,
        language: Optional[str] = None,
        prompt: Optional[str] = None,
        response_format: str = "json",
        hotwords: Optional[str] = None,
        temperature: float = 0.0,
        seed: Optional[int] = None,
        top_p: float = 1.0,
        top_k: int = 0,
        min_p: float = 0.0,
        repetition_penalty: float = 1.0,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        task: str = "transcribe",
    ) -> Union[Dict[str, Any], str]: ...
