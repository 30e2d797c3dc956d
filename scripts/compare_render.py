#!/usr/bin/env python3
"""Compare aphro's render server with vLLM's own Rust render server, answer by answer.

`aphro launch render MODEL` must answer exactly like `vllm-rs render MODEL` (the Rust render
server shipped inside the vllm 0.33.0 wheel). This script starts both on free loopback ports on
the same model directory (same tokenizer, same chat template, same flags), sends every request
of a corpus (scripts/render_corpus.json) to both, and diffs the answers (HTTP status + JSON
body) field by field. Random-by-nature fields are compared by shape only (RANDOM_FIELDS);
deliberate, documented differences are listed in DOCUMENTED_DIFFERENCES (and in
docs/render-compat.md). Any other difference makes the exit status 1.

    scripts/compare_render.py --vllm-rs PATH --aphro PATH MODEL [MODEL ...]
    scripts/compare_render.py --fetch MODEL ...     # vllm-rs from the pinned vllm wheel

MODEL is an HF-layout model directory (config.json, tokenizer.json, tokenizer_config.json,
optionally chat_template.jinja; no weights needed), or `fixture:NAME`, which assembles such a
directory from the tokenizer fixtures (see FIXTURE_MODELS), or `arch:NAME`, a tiny complete
model of fixtures/arch/models. Options may follow after commas:

    fixture:qwen3,tool=hermes,reasoning=qwen3,max_model_len=4096
    fixture:smollm2,aphro_model=/path/SmolLM2-135M-Instruct.Q4_1.gguf

`tool` / `reasoning` set --tool-call-parser / --reasoning-parser on both servers (aphro also
gets --enable-auto-tool-choice, which vllm-rs has no flag for); without them vllm-rs gets
`none` (its default is `auto`, aphro has no parser by default). `vllm_tool` / `vllm_reasoning`
override what vllm-rs gets where its names differ (`auto` = leave its default), e.g.
`fixture:gpt_oss,tool=openai,reasoning=openai_gptoss,vllm_tool=auto,vllm_reasoning=auto`
(vllm-rs parses gpt-oss natively with Harmony and refuses a generic parser there). `max_model_len` is `config`
(the default: derived from config.json and passed to both), `none` (passed to neither), or a
number. `aphro_model` gives aphro another file for the same model (e.g. the GGUF) instead of the
directory; it is then served under the directory's name.

Only the Python 3 standard library is used.
"""
import argparse
import fnmatch
import hashlib
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CORPUS = ROOT / "scripts" / "render_corpus.json"

# --- the reference binary --------------------------------------------------------------------

VLLM_VERSION = "0.33.0"
# The wheel pip picks on x86-64 Linux (any CPython >= 3.8; abi3).
VLLM_WHEEL = "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl"
VLLM_WHEEL_SHA256 = "4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa"
VLLM_RS_MEMBER = "vllm/vllm-rs"
VLLM_RS_SHA256 = "ee53a9eec77b858799f7526ad0f284df808d9350b8b4d6f1754583f9f8782c62"

# --- what the diff ignores -------------------------------------------------------------------

# Fields whose values are random by nature. Each entry: (regex over the JSON path, regex over
# the value). When both match, the random part (the named group `r`, or the whole value) is
# replaced by a placeholder that keeps only its shape, so `chatcmpl-<8 hex>` and
# `chatcmpl-<16 hex>` still differ, but two fresh ids of the same shape do not.
RANDOM_FIELDS = [
    # request ids: chat `chatcmpl-<random>`, completions `cmpl-<random>` / `cmpl-<random>-<i>`
    (r"^(\[\d+\])?\.request_id$", r"^(chatcmpl-|cmpl-)(?P<r>[0-9a-fA-F]{6,}|[0-9a-fA-F-]{36})(-\d+)?$"),
    # /v1/models: creation timestamps of the model card and of its permission objects
    (r"^\.data\[\d+\]\.created$", r"^\d+$"),
    (r"^\.data\[\d+\]\.permission\[\d+\]\.created$", r"^\d+$"),
    # /v1/models: permission ids `modelperm-<random>`
    (r"^\.data\[\d+\]\.permission\[\d+\]\.id$", r"^modelperm-(?P<r>[0-9a-fA-F]{6,}|[0-9a-fA-F-]{36})$"),
]

# Deliberate differences, each with a one-line reason (keep docs/render-compat.md in step).
# Each entry: {"request": fnmatch pattern over request names, "path": regex over JSON paths,
#              "reason": "..."}, optionally "aphro" / "vllm_rs": regexes that must fullmatch
# the value on that side as the report prints it (`<absent>`, `null`, JSON), so an entry covers
# only the expected pair of values and a changed value still shows; optionally "status": the
# (aphro, vllm-rs) HTTP status pair the entry needs, which lets one entry cover a whole answer
# (path ".") where one server renders and the other refuses. `<status>` is the path of
# the HTTP status, `<bytes>` of a serialization-only difference (same JSON, different bytes: key
# order, number spelling). Only differences where vLLM 0.33.0's Python server (the reference,
# see docs/spec/api.md) answers as aphro does and vllm-rs deviates belong here; paths below
# are relative to vllm/ in the wheel. The few places where aphro deviates from both on purpose
# carry "deliberate": True and say why. "model" (an fnmatch pattern over the model spec)
# limits an entry to some models. "gap": True marks what aphro does not do yet (a known gap,
# listed in docs/render-compat.md and counted apart, not a deliberate difference).
_CHAT_RENDER = "chat*/*"
_COMPLETION_RENDER = "completion*/*"
_NULL_FIELDS = r"(cache_salt|content_parts|ec_transfer_params|features|kv_transfer_params|reasoning_ended|reasoning_parser_kwargs|return_token_ids|stream_options|token_offsets)"
_SP_FLOAT_DEFAULTS = r"(presence_penalty|frequency_penalty|repetition_penalty|temperature|top_p|min_p)"
DOCUMENTED_DIFFERENCES = [
    # --- GenerateRequest is a full pydantic dump -------------------------------------------
    {"request": _CHAT_RENDER, "path": rf"^\.{_NULL_FIELDS}$", "aphro": "null", "vllm_rs": "<absent>",
     "reason": "Python dumps the whole GenerateRequest, nulls included "
               "(entrypoints/serve/utils/api_utils.py:create_json_response uses model_dump()); vllm-rs omits null fields"},
    {"request": _COMPLETION_RENDER, "path": rf"^\[\d+\]\.({_NULL_FIELDS[1:-1]}|parse_context)$", "aphro": "null", "vllm_rs": "<absent>",
     "reason": "Python dumps the whole GenerateRequest, nulls included "
               "(entrypoints/serve/utils/api_utils.py:create_json_response uses model_dump()); vllm-rs omits null fields"},
    {"request": _CHAT_RENDER, "path": r"^\.output_mode$", "aphro": '"tokens"', "vllm_rs": "<absent>",
     "reason": "GenerateRequest.output_mode defaults to \"tokens\" and is dumped "
               "(entrypoints/scale_out/token_in_token_out/protocol.py:GenerateRequest, api_utils.py:create_json_response)"},
    {"request": _COMPLETION_RENDER, "path": r"^\[\d+\]\.output_mode$", "aphro": '"tokens"', "vllm_rs": "<absent>",
     "reason": "GenerateRequest.output_mode defaults to \"tokens\" and is dumped "
               "(entrypoints/scale_out/token_in_token_out/protocol.py:GenerateRequest, api_utils.py:create_json_response)"},
    {"request": _CHAT_RENDER, "path": r"^\.parse_context$", "aphro": r'\{"tools": .*', "vllm_rs": "<absent>",
     "reason": "Python's chat render always fills parse_context "
               "(entrypoints/scale_out/render/serving.py:render_chat_request -> _build_parse_context); vllm-rs omits it"},
    {"request": "chat/no_model_field", "path": r"^\.model$", "aphro": "null", "vllm_rs": r'"[^"]+"',
     "reason": "Python copies request.model, None when the request has no model "
               "(entrypoints/scale_out/render/serving.py:render_chat_request, model=request.model); vllm-rs fills in the served name"},
    # --- request ids -----------------------------------------------------------------------
    {"request": _CHAT_RENDER, "path": r"^\.request_id$", "aphro": '"chatcmpl-<16 hex>"', "vllm_rs": '"chatcmpl-<8 hex>"',
     "reason": "Python's ids are chatcmpl-<random_uuid()>, 16 hex (utils/__init__.py:random_uuid; "
               "entrypoints/scale_out/render/serving.py:render_chat_request); vllm-rs uses 8 hex"},
    {"request": _COMPLETION_RENDER, "path": r"^\[\d+\]\.request_id$", "aphro": r'"cmpl-<16 hex>(-\d+)?"', "vllm_rs": r'"cmpl-<8 hex>(-\d+)?"',
     "reason": "Python's ids are cmpl-<random_uuid()>, 16 hex (utils/__init__.py:random_uuid; "
               "entrypoints/scale_out/render/serving.py:render_completion_request); vllm-rs uses 8 hex"},
    # --- SamplingParams as msgspec serializes it -------------------------------------------
    {"request": _CHAT_RENDER, "path": rf"^\.sampling_params\.{_SP_FLOAT_DEFAULTS}$", "aphro": r"-?\d+\.\d+", "vllm_rs": "<absent>",
     "reason": "msgspec omit_defaults omits only values identical to the default object; the request's own float "
               "defaults are other objects, so they are dumped (sampling_params.py:SamplingParams, "
               "v1/serial_utils.py:_serialize_msgspec, entrypoints/openai/chat_completion/protocol.py:to_sampling_params)"},
    {"request": _COMPLETION_RENDER, "path": rf"^\[\d+\]\.sampling_params\.{_SP_FLOAT_DEFAULTS}$", "aphro": r"-?\d+\.\d+", "vllm_rs": "<absent>",
     "reason": "msgspec omit_defaults omits only values identical to the default object; the request's own float "
               "defaults are other objects, so they are dumped (sampling_params.py:SamplingParams, "
               "v1/serial_utils.py:_serialize_msgspec, entrypoints/openai/completion/protocol.py:to_sampling_params)"},
    {"request": "*", "path": r"^(\[\d+\])?\.sampling_params\.(stop|stop_token_ids|bad_words)$", "aphro": r"\[\]", "vllm_rs": "<absent>",
     "reason": "SamplingParams.__post_init__ turns None into [] for stop, stop_token_ids and bad_words, "
               "and [] is not the default None, so it is dumped (sampling_params.py:SamplingParams.__post_init__)"},
    {"request": "*", "path": r"^(\[\d+\])?\.sampling_params\.output_kind$", "aphro": "[12]", "vllm_rs": "<absent>",
     "reason": "to_sampling_params sets output_kind DELTA (1) when streaming, FINAL_ONLY (2) otherwise, never the "
               "default CUMULATIVE (entrypoints/openai/chat_completion/protocol.py:to_sampling_params, completion/protocol.py:to_sampling_params)"},
    {"request": "*", "path": r"^(\[\d+\])?\.sampling_params\.skip_clone$", "aphro": "true", "vllm_rs": "<absent>",
     "reason": "to_sampling_params always passes skip_clone=True (entrypoints/openai/chat_completion/protocol.py:to_sampling_params, "
               "completion/protocol.py:to_sampling_params)"},
    {"request": "*", "path": r"^(\[\d+\])?\.sampling_params\.skip_reading_prefix_cache$", "aphro": "true|false", "vllm_rs": "<absent>",
     "reason": "SamplingParams.__post_init__ resolves skip_reading_prefix_cache from None to a bool "
               "(true with prompt logprobs), so it is dumped (sampling_params.py:SamplingParams.__post_init__)"},
    {"request": "*", "path": r"^(\[\d+\])?\.sampling_params\.ignore_eos$", "aphro": "<absent>", "vllm_rs": "false",
     "reason": "ignore_eos=False is the default singleton, which msgspec omit_defaults drops "
               "(sampling_params.py:SamplingParams omit_defaults=True, v1/serial_utils.py:_serialize_msgspec); vllm-rs writes it"},
    # --- max_tokens defaults to the remaining context --------------------------------------
    {"request": _CHAT_RENDER, "path": r"^\.sampling_params\.max_tokens$", "aphro": r"\d+", "vllm_rs": "<absent>",
     "reason": "without max_tokens Python uses max_model_len - prompt length "
               "(entrypoints/serve/utils/api_utils.py:get_max_tokens, called by render/serving.py:render_chat_request)"},
    {"request": "completion/max_tokens_null", "path": r"^\[0\]\.sampling_params\.max_tokens$", "aphro": r"\d+", "vllm_rs": "16",
     "reason": "an explicit max_tokens: null is None, not the field default 16, so get_max_tokens returns the remaining context "
               "(entrypoints/serve/utils/api_utils.py:get_max_tokens, render/serving.py:render_completion_request)"},
    # --- routes vllm-rs lacks ---------------------------------------------------------------
    {"request": "utility/version", "path": r"^<status>$", "aphro": "200", "vllm_rs": "404",
     "reason": "the Python render server registers GET /version (entrypoints/serve/instrumentator/basic.py:53, "
               "via entrypoints/launchers/api_server/routers.py:register_api_routers); vllm-rs has no such route"},
    {"request": "utility/version", "path": r"^<body>$", "aphro": r'"\{\\"version\\":\\"0\.33\.0\\"\}"', "vllm_rs": '""',
     "reason": "the Python render server registers GET /version (entrypoints/serve/instrumentator/basic.py:53); vllm-rs answers an empty 404"},
    {"request": "tokenize*/*", "path": r"^<status>$", "aphro": "200|400|404", "vllm_rs": "404",
     "reason": "the Python render server registers /tokenize (entrypoints/serve/tokenize/api_router.py:36, attached by "
               "entrypoints/serve/__init__.py:register_vllm_serve_api_routers); vllm-rs has no such route"},
    {"request": "detokenize*/*", "path": r"^<status>$", "aphro": "200|400|404", "vllm_rs": "404",
     "reason": "the Python render server registers /detokenize (entrypoints/serve/tokenize/api_router.py:62); vllm-rs has no such route"},
    {"request": "tokenize*/*", "path": r"^<body>$", "vllm_rs": '""',
     "reason": "the Python render server registers /tokenize (entrypoints/serve/tokenize/api_router.py:36); vllm-rs answers an empty 404"},
    {"request": "detokenize*/*", "path": r"^<body>$", "vllm_rs": '""',
     "reason": "the Python render server registers /detokenize (entrypoints/serve/tokenize/api_router.py:62); vllm-rs answers an empty 404"},
    {"request": "utility/unknown_route", "path": r"^<body>$", "aphro": r'"\{\\"detail\\":\\"Not Found\\"\}"', "vllm_rs": '""',
     "reason": "the Python server is a FastAPI app (entrypoints/launchers/app.py:build_app) with Starlette's default "
               "404 body {\"detail\":\"Not Found\"}; vllm-rs answers an empty body"},
]

# --- Python renders what vllm-rs refuses (and the reverse) ----------------------------------
_STATUS_RENDERS = [
    ("chat/continue_final_message_on_user",
     "Python has no last-role check: transformers' apply_chat_template continues whichever message is last "
     "(renderers/hf.py:safe_apply_chat_template); vllm-rs refuses a final message that is not the assistant's"),
    ("chat/content_parts_empty_list",
     "an empty part list renders as empty content (renderers/chat_utils/chat_message.py:parse_chat_message_content_parts, "
     "\"\\n\".join of no texts); vllm-rs refuses empty content"),
    ("chat/content_empty_string", "\"\" is a text part like any other (renderers/chat_utils/chat_message.py); vllm-rs refuses empty content"),
    ("chat/content_null_user",
     "content null becomes [] (renderers/chat_utils/chat_message.py: `if content is None: content = []`); vllm-rs refuses it"),
    ("chat_invalid/text_part_missing_text",
     "a text part without text is skipped with a warning (PART_TYPES_TO_SKIP_NONE_CONTENT, "
     "renderers/chat_utils/chat_message.py:467); vllm-rs refuses it"),
    ("chat/content_part_refusal",
     "refusal parts are text (MM_PARSER_MAP[\"refusal\"], renderers/chat_utils/chat_message.py:116); vllm-rs refuses the part type"),
    ("chat/n_and_seed",
     "Python renders n > 1 (SamplingParams n up to VLLM_MAX_N_SEQUENCES = 16384, sampling_params.py:_verify_num_sequences); "
     "vllm-rs takes only n = 1"),
    ("completion/sampling", "Python renders n > 1 (sampling_params.py:_verify_num_sequences); vllm-rs takes only n = 1"),
    ("chat/special_tokens_flags",
     "Python takes spaces_between_special_tokens (entrypoints/openai/chat_completion/protocol.py:297, to_sampling_params); vllm-rs refuses it"),
    ("chat_invalid/empty_messages",
     "messages has no minimum length (entrypoints/openai/chat_completion/protocol.py:238) and this template renders an "
     "empty conversation; vllm-rs refuses an empty list"),
    ("chat_invalid/top_logprobs_too_many",
     "the max_logprobs cap (20) is checked by the engine (sampling_params.py:_validate_logprobs, called from "
     "v1/engine/input_processor.py), not by the render server; vllm-rs checks it at render"),
    ("completion_invalid/logprobs_too_many",
     "the max_logprobs cap (20) is checked by the engine (sampling_params.py:_validate_logprobs via "
     "v1/engine/input_processor.py), not by the render server; vllm-rs checks it at render"),
    ("completion_invalid/token_id_out_of_vocab",
     "token ids are checked against the vocabulary by the engine (renderers/base.py:validate_token_ids, called from "
     "v1/engine/input_processor.py:647), not at render; vllm-rs checks at render"),
    ("completion/list_of_strings",
     "a list of prompts is one GenerateRequest per prompt (entrypoints/openai/completion/protocol.py prompt type, "
     "entrypoints/scale_out/render/serving.py:render_completion_request); vllm-rs takes a single prompt"),
    ("completion/single_string_in_list", "a one-element prompt list is a prompt list (entrypoints/scale_out/render/serving.py:render_completion_request); vllm-rs takes a single prompt"),
    ("completion/list_of_token_lists", "a list of token lists is one GenerateRequest each (entrypoints/scale_out/render/serving.py:render_completion_request); vllm-rs takes a single prompt"),
    ("completion/request_id_header", "a prompt list is one GenerateRequest each, ids <X-Request-Id>-<i> (entrypoints/scale_out/render/serving.py:render_completion_request); vllm-rs takes a single prompt"),
]
DOCUMENTED_DIFFERENCES += [
    {"request": name, "path": ".", "status": (200, 400), "reason": reason} for name, reason in _STATUS_RENDERS
]
DOCUMENTED_DIFFERENCES += [
    {"request": "chat_invalid/max_tokens_over_context", "path": ".", "status": (400, 200),
     "reason": "Python refuses max_tokens > max_model_len at render (renderers/params.py:TokenizeParams, \"cannot be greater than "
               "max_model_len\"); vllm-rs renders it"},
    # Deliberate: the template never reads what was sent, so it would be dropped without a word.
    {"request": "chat/template_kwargs_*", "path": ".", "status": (400, 200), "deliberate": True,
     "reason": "deliberate: a chat_template_kwargs key the template never reads is a 400 naming it; Python "
               "(renderers/hf.py:resolve_chat_template_kwargs) and vllm-rs drop it silently"},
    {"request": "chat/reasoning_effort", "path": ".", "status": (400, 200), "deliberate": True,
     "reason": "deliberate: reasoning_effort on a template that never reads it is a 400; Python and vllm-rs drop it silently"},
]

# --- what Python puts in a rendered request that vllm-rs leaves out -------------------------
DOCUMENTED_DIFFERENCES += [
    {"request": "utility/models", "path": r"^\.data\[\d+\]\.root$", "model": "*aphro_model=*",
     "reason": "root is the path each server loaded, and aphro_model= gives aphro another file of the model"},
    {"request": "utility/models", "path": r"^\.data\[\d+\]\.permission$", "vllm_rs": "<absent>",
     "reason": "Python's model card carries permission=[ModelPermission()] (entrypoints/openai/models/serving.py:73); vllm-rs has none"},
    {"request": "chat/template_kwargs_add_generation_prompt", "path": r"^\.(token_ids|reasoning_parser_kwargs)$",
     "reason": "the request's own add_generation_prompt (true) wins over chat_template_kwargs (merge_kwargs in "
               "entrypoints/openai/chat_completion/protocol.py:build_chat_params), and reasoning_parser_kwargs is null "
               "without a reasoning parser (render/serving.py:_reasoning_parser_kwargs); vllm-rs lets the kwarg win"},
    {"request": "chat/content_parts_*", "path": r"^\.token_ids$",
     "reason": "text parts are joined with \"\\n\" for string-format templates (renderers/chat_utils/chat_message.py:137); vllm-rs joins with \"\""},
    {"request": "chat/stop_*", "path": r"^\.sampling_params\.(stop|include_stop_str_in_output|output_text_buffer_length)$",
     "aphro": r".+", "vllm_rs": "<absent>",
     "reason": "to_sampling_params passes stop and include_stop_str_in_output, and SamplingParams.__post_init__ sets "
               "output_text_buffer_length = longest stop - 1 (sampling_params.py:601); vllm-rs drops stop strings"},
    {"request": "chat/stream_with_options", "path": r"^\.stream_options\.continuous_usage_stats$", "aphro": "false", "vllm_rs": "null",
     "reason": "StreamOptions.continuous_usage_stats defaults to False (entrypoints/generate/base/protocol.py:295)"},
    {"request": "chat/passthrough_fields", "path": r"^\.sampling_params\.(extra_args|vllm_xargs)$",
     "reason": "to_sampling_params passes vllm_xargs as SamplingParams.extra_args "
               "(entrypoints/openai/chat_completion/protocol.py:783); vllm-rs writes a vllm_xargs key"},
    {"request": "chat/include_reasoning_false", "path": r"^\.reasoning_ended$", "aphro": "true", "vllm_rs": "<absent>",
     "reason": "resolve_reasoning_ended returns True when include_reasoning is false "
               "(entrypoints/openai/chat_completion/protocol.py:624)"},
    {"request": "chat/return_token_offsets", "path": r"^\.token_offsets$", "vllm_rs": "<absent>",
     "reason": "return_token_offsets attaches prompt_token_offsets (renderers/base.py:619-641, copied by "
               "render/serving.py:render_chat_request); vllm-rs has no offsets"},
]

# --- error bodies ---------------------------------------------------------------------------
_ERROR_FIELDS = r"^\.error\.(message|param|type)$"
DOCUMENTED_DIFFERENCES += [
    # pydantic's structural errors, as FastAPI's RequestValidationError handler words them.
    {"request": "*", "path": r"^\.error\.message$", "aphro": r'"\d+ validation errors?:\\n.*"',
     "reason": "a structural error is Python's RequestValidationError body: \"N validation error(s):\" and pydantic's "
               "error dicts (entrypoints/serve/exception_handling/handlers/validation.py:validation_exception_handler); "
               "vllm-rs sends serde's message"},
    {"request": "*", "path": r"^\.error\.param$", "aphro": r'"body(\.[^"]*)?"', "vllm_rs": "null",
     "reason": "the structural error's param is its cleaned loc, e.g. body.messages.0.role "
               "(handlers/validation.py:clean_loc_for_param)"},
]
_ERROR_SITES = [
    ("chat/tools_auto", "online_renderer.py:render_chat: \"auto\" tool choice without a tool parser"),
    ("chat/tools_default_choice", "online_renderer.py:render_chat: tools default to tool_choice \"auto\", which needs a tool parser"),
    ("chat/tools_no_description", "online_renderer.py:render_chat: \"auto\" tool choice without a tool parser"),
    ("chat/tools_parallel_false", "online_renderer.py:render_chat: \"auto\" tool choice without a tool parser"),
    ("chat/tool_history*", "online_renderer.py:render_chat: \"auto\" tool choice without a tool parser"),
    ("chat/tools_required", "online_renderer.py:render_chat: tool_choice=\"required\" without a tool parser"),
    ("chat/tools_strict_flag", "online_renderer.py:render_chat: tool_choice=\"required\" without a tool parser"),
    ("chat/tools_named", "online_renderer.py:render_chat: a named tool_choice without a tool parser"),
    ("chat/tools_required_*", "online_renderer.py:render_chat: tool_choice=\"required\" without a tool parser"),
    ("chat/tools_auto_*", "online_renderer.py:render_chat: \"auto\" tool choice without a tool parser"),
    ("chat/tools_named_unknown", "chat_completion/protocol.py:check_tool_usage, parameter tool_choice"),
    ("chat/tool_choice_without_tools", "chat_completion/protocol.py:check_tool_usage, parameter tool_choice"),
    ("chat/structured_outputs_two_kinds", "chat_completion/protocol.py:check_structured_outputs_count, no parameter"),
    ("chat/stream_options_without_stream", "chat_completion/protocol.py:validate_stream_options, parameter stream_options"),
    ("chat_invalid/top_logprobs_without_logprobs", "chat_completion/protocol.py:check_logprobs, parameter top_logprobs"),
    ("chat/max_tokens_zero", "sampling_params.py:_verify_args, parameter max_tokens"),
    ("chat_invalid/max_tokens_negative", "sampling_params.py:_verify_args (pydantic's int accepts -1), parameter max_tokens"),
    ("completion_invalid/max_tokens_negative", "sampling_params.py:_verify_args (pydantic's int accepts -3), parameter max_tokens"),
    ("completion_invalid/prompt_fills_context", "get_max_tokens leaves 0, which sampling_params.py:_verify_args refuses"),
    ("chat_invalid/temperature_negative", "sampling_params.py:_verify_args, parameter temperature"),
    ("chat_invalid/top_p_zero", "sampling_params.py:_verify_args, parameter top_p"),
    ("chat_invalid/top_k_negative", "sampling_params.py:_verify_args, no parameter"),
    ("chat_invalid/n_zero", "sampling_params.py:_verify_num_sequences"),
    ("*/over_length_*", "entrypoints/serve/utils/api_utils.py:get_max_tokens, a ValueError: no parameter"),
    ("completion_invalid/truncate_over_max_model_len", "renderers/params.py:TokenizeParams, parameter truncate_prompt_tokens"),
    ("*/beam_search", "entrypoints/scale_out/render/serving.py: \"Beam search is not supported by the render endpoint\""),
    ("completion/suffix", "renderers/online_renderer.py:render_completion, parameter suffix"),
    ("chat_invalid/unknown_content_part", "renderers/chat_utils/chat_message.py:550, parameter type"),
    ("chat_invalid/image_part_text_model", "the multimodal registry refuses a text-only model (renderers/chat_utils/item_tracker.py:263)"),
    ("completion/empty_string", "completion/protocol.py:validate_prompt_and_prompt_embeds refuses prompt \"\", parameter prompt"),
    ("completion_invalid/missing_prompt", "completion/protocol.py:validate_prompt_and_prompt_embeds, parameter prompt"),
    ("completion_invalid/empty_list", "renderers/base.py:render_prompts, parameter prompt"),
    ("completion_invalid/empty_token_list_in_list", "entrypoints/scale_out/render/serving.py: \"No token_ids rendered\""),
    ("completion_invalid/prompt_embeds", "renderers/embed_utils.py: prompt_embeds need --enable-prompt-embeds"),
]
DOCUMENTED_DIFFERENCES += [
    {"request": name, "path": _ERROR_FIELDS, "status": (400, 400),
     "reason": f"Python's own message, type and parameter for this check ({site}; a VLLMValidationError raised in a "
               "request validator is not a ValueError, so it leaves pydantic and create_error_response makes it a "
               "BadRequestError); vllm-rs words its own"}
    for name, site in _ERROR_SITES
]
DOCUMENTED_DIFFERENCES += [
    {"request": "completion_invalid/n_too_large", "path": _ERROR_FIELDS, "status": (400, 400), "deliberate": True,
     "reason": "deliberate: aphro caps n at --max-n (128 by default) where Python allows 16384 (VLLM_MAX_N_SEQUENCES); "
               "vllm-rs takes only n = 1"},
    {"request": "completion_invalid/negative_token_id", "path": _ERROR_FIELDS, "status": (400, 400), "deliberate": True,
     "reason": "deliberate: token ids are unsigned on aphro's wire, so a negative id is refused at render; Python "
               "renders it and its engine refuses it (renderers/base.py:validate_token_ids)"},
    {"request": "chat_invalid/seed_out_of_range", "path": _ERROR_FIELDS, "status": (400, 400), "deliberate": True,
     "reason": "deliberate: seed is a 64-bit integer, as the engine's generator takes it; Python's int has no bound"},
    {"request": "chat/lone_surrogate_escape", "path": _ERROR_FIELDS, "status": (400, 400), "deliberate": True,
     "reason": "deliberate: a lone surrogate is not Unicode text and fails JSON decoding; Python's json.loads keeps it "
               "in a str that the Rust tokenizer cannot take"},
]

# --- with parsers -----------------------------------------------------------------------------
DOCUMENTED_DIFFERENCES += [
    {"request": "chat*/*", "path": r"^\.(reasoning_ended|reasoning_parser_kwargs(\..*)?)$", "model": "*reasoning=*",
     "reason": "with a reasoning parser Python sends reasoning_parser_kwargs = the effective template kwargs (the "
               "server defaults such as cohere_format, add_generation_prompt, continue_final_message) and reasoning_ended "
               "= the parser's is_reasoning_end on the prompt (render/serving.py:render_chat_request, "
               "chat_completion/protocol.py:resolve_reasoning_ended); vllm-rs omits both"},
    {"request": "chat*/*", "path": r"^\.sampling_params\.skip_special_tokens$", "aphro": "false", "vllm_rs": "<absent>",
     "model": "*tool=hermes*",
     "reason": "the hermes parser's adjust_request sets skip_special_tokens = False when tools are offered "
               "(tool_parsers/hermes_tool_parser.py:67)"},
    {"request": "chat/tool_history_invalid_arguments_json", "path": ".", "status": (200, 400),
     "reason": "arguments that are not JSON become {} in the template's view (tool_arguments: invalid JSON -> {}, as "
               "vLLM's chat_message parsing does); vllm-rs refuses the history"},
    {"request": "completion/empty_string", "path": ".", "status": (400, 200),
     "reason": "completion/protocol.py:validate_prompt_and_prompt_embeds refuses prompt \"\" before tokenizing; "
               "vllm-rs renders the BOS token alone"},
    {"request": "*/empty_messages", "path": _ERROR_FIELDS, "status": (400, 400), "deliberate": True,
     "reason": "deliberate: Python returns jinja2's own error for a template that cannot render no messages (e.g. "
               "\"list object has no element 0\", renderers/hf.py:safe_apply_chat_template); aphro's template engine "
               "words errors differently, so the message says what happened and names messages"},
    {"request": "chat*/*", "path": _ERROR_FIELDS, "status": (400, 400), "model": "fixture:mistral7b_spm*",
     "aphro": r'"As of transformers v4\.44, default chat template is no longer allowed.*"|"BadRequestError"|null',
     "reason": "a tokenizer without a chat template: Python's ChatTemplateResolutionError (renderers/hf.py:"
               "safe_apply_chat_template), raised before the checks vllm-rs fails first"},
    {"request": "chat/template_kwargs_generic*", "path": _ERROR_FIELDS, "status": (400, 400), "deliberate": True,
     "model": "fixture:gpt_oss*",
     "reason": "deliberate: chat_template_kwargs the template never reads is a 400 naming them (see above); "
               "vllm-rs maps enable_thinking=false to Harmony's reasoning_effort and refuses that"},
]

DOCUMENTED_DIFFERENCES += [
    {"request": "chat*/*", "path": r"^\.reasoning_parser_kwargs$", "aphro": "null", "vllm_rs": r"\{.*\}",
     "reason": "without a reasoning parser reasoning_parser_kwargs is None (render/serving.py:_reasoning_parser_kwargs); "
               "vllm-rs fills it whenever the request has template kwargs"},
]

# --- fixture models --------------------------------------------------------------------------

# Model directories assembled from the tokenizer fixtures: the tokenizer files plus a config.json
# trimmed to what a render server reads (architecture, model type, vocabulary size, context
# length, bos/eos ids), with the upstream model's values. vocab_size is raised to the
# tokenizer's size where the fixture tokenizer has more ids than the upstream config.
FIXTURE_MODELS = {
    "smollm2": {"arch": "LlamaForCausalLM", "model_type": "llama", "ctx": 8192, "vocab": 49152, "bos": 1, "eos": 2},
    "qwen3": {"arch": "Qwen3ForCausalLM", "model_type": "qwen3", "ctx": 40960, "vocab": 151936, "bos": 151643, "eos": 151645},
    "llama3": {"arch": "LlamaForCausalLM", "model_type": "llama", "ctx": 131072, "vocab": 128256, "bos": 128000, "eos": [128001, 128008, 128009]},
    "deepseek_v3": {"arch": "DeepseekV3ForCausalLM", "model_type": "deepseek_v3", "ctx": 163840, "vocab": 129280, "bos": 0, "eos": 1},
    "deepseek_r1": {"arch": "DeepseekV3ForCausalLM", "model_type": "deepseek_v3", "ctx": 163840, "vocab": 129280, "bos": 0, "eos": 1},
    "deepseek_v3_1": {"arch": "DeepseekV3ForCausalLM", "model_type": "deepseek_v3", "ctx": 163840, "vocab": 129280, "bos": 0, "eos": 1},
    "gemma3": {"arch": "Gemma3ForCausalLM", "model_type": "gemma3_text", "ctx": 32768, "vocab": 262144, "bos": 2, "eos": 1},
    "gpt_oss": {"arch": "GptOssForCausalLM", "model_type": "gpt_oss", "ctx": 131072, "vocab": 201088, "bos": 199998, "eos": 200002},
    "glm4_7_flash": {"arch": "Glm4MoeLiteForCausalLM", "model_type": "glm4_moe_lite", "ctx": 202752, "vocab": 154880},
    "mistral7b_spm": {"arch": "MistralForCausalLM", "model_type": "mistral", "ctx": 32768, "vocab": 32000, "bos": 1, "eos": 2},
}
FIXTURE_FILES = ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]


def fixtures_roots():
    env = os.environ.get("APHRO_FIXTURES")
    roots = [Path(env)] if env else []
    roots += [ROOT / "shared" / "fixtures", ROOT.parent / "shared" / "fixtures"]
    return [r for r in roots if r.is_dir()]


def cache_dir() -> Path:
    base = os.environ.get("APHRO_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "aphro")
    return Path(base) / "render-compare"


def tokenizer_size(tok_json: Path) -> int:
    t = json.loads(tok_json.read_text(encoding="utf-8"))
    vocab = t.get("model", {}).get("vocab")
    ids = [-1]
    if isinstance(vocab, dict):
        ids.append(max(vocab.values(), default=-1))
    elif isinstance(vocab, list):
        ids.append(len(vocab) - 1)
    ids += [a["id"] for a in t.get("added_tokens", [])]
    return max(ids) + 1


def assemble_fixture(name: str) -> Path:
    if name not in FIXTURE_MODELS:
        sys.exit(f"unknown fixture `{name}`; known: {', '.join(sorted(FIXTURE_MODELS))}")
    src = None
    for r in fixtures_roots():
        if (r / "tokenizers" / name / "tokenizer.json").is_file():
            src = r / "tokenizers" / name
            break
    if src is None:
        sys.exit(f"fixture `{name}`: no tokenizers/{name}/tokenizer.json under "
                 f"{[str(r) for r in fixtures_roots()] or 'any fixtures root (set APHRO_FIXTURES)'}")
    spec = FIXTURE_MODELS[name]
    out = cache_dir() / "models" / name
    out.mkdir(parents=True, exist_ok=True)
    for f in FIXTURE_FILES:
        target = out / f
        if target.is_symlink() or target.exists():
            target.unlink()
        if (src / f).is_file():
            target.symlink_to((src / f).resolve())
    cfg = {
        "architectures": [spec["arch"]],
        "model_type": spec["model_type"],
        "max_position_embeddings": spec["ctx"],
        "vocab_size": max(spec["vocab"], tokenizer_size(src / "tokenizer.json")),
    }
    if "bos" in spec:
        cfg["bos_token_id"] = spec["bos"]
    if "eos" in spec:
        cfg["eos_token_id"] = spec["eos"]
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return out


def resolve_arch(name: str) -> Path:
    for r in fixtures_roots():
        d = r / "arch" / "models" / name
        if (d / "config.json").is_file():
            return d
    sys.exit(f"arch model `{name}` not found under {[str(r) for r in fixtures_roots()]}")


def max_model_len_from_config(cfg: dict):
    # vLLM's derivation, the common keys only (no rope-scaling factor).
    for key in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length",
                "max_sequence_length", "max_seq_length", "seq_len", "model_max_length"):
        v = cfg.get(key)
        if isinstance(v, int):
            return v
    tc = cfg.get("text_config")
    if isinstance(tc, dict):
        return max_model_len_from_config(tc)
    return None


# --- fetching vllm-rs ------------------------------------------------------------------------

def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_vllm_rs() -> Path:
    """vllm-rs from the pinned vllm wheel, downloaded once with pip and verified."""
    d = cache_dir() / f"vllm-{VLLM_VERSION}"
    binary = d / "vllm-rs"
    if binary.is_file() and sha256_of(binary) == VLLM_RS_SHA256:
        return binary
    wheel_dir = d / "wheel"
    wheel_dir.mkdir(parents=True, exist_ok=True)
    wheel = wheel_dir / VLLM_WHEEL
    if not wheel.is_file() or sha256_of(wheel) != VLLM_WHEEL_SHA256:
        # --require-hashes makes pip refuse anything but the pinned file, before it is kept.
        req = wheel_dir / "requirements.txt"
        req.write_text(f"vllm=={VLLM_VERSION} --hash=sha256:{VLLM_WHEEL_SHA256}\n")
        print(f"downloading vllm=={VLLM_VERSION} (about 340 MB) with pip ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                        "--platform", "manylinux_2_28_x86_64", "--require-hashes",
                        "-r", str(req), "-d", str(wheel_dir)], check=True)
    if not wheel.is_file():
        sys.exit(f"pip did not produce {wheel}")
    got = sha256_of(wheel)
    if got != VLLM_WHEEL_SHA256:
        sys.exit(f"{wheel}: sha256 {got}, expected {VLLM_WHEEL_SHA256}")
    with zipfile.ZipFile(wheel) as z:
        tmp = binary.with_suffix(".part")
        with z.open(VLLM_RS_MEMBER) as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst)
    got = sha256_of(tmp)
    if got != VLLM_RS_SHA256:
        tmp.unlink()
        sys.exit(f"{VLLM_RS_MEMBER} in {wheel}: sha256 {got}, expected {VLLM_RS_SHA256}")
    tmp.chmod(0o755)
    tmp.replace(binary)
    return binary


def default_aphro() -> Path:
    cands = [p for p in (ROOT / "target" / "release" / "aphro", ROOT / "target" / "debug" / "aphro")
             if p.is_file()]
    if not cands:
        sys.exit("no aphro binary: pass --aphro or set APHRO_BIN (or build target/{release,debug}/aphro)")
    return max(cands, key=lambda p: p.stat().st_mtime)


# --- servers ---------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


HARMONY_START_DATE = "2025-07-15"


class Server:
    def __init__(self, label, argv, port, log_dir):
        self.label, self.argv, self.port = label, argv, port
        self.log_path = Path(log_dir) / f"{label}.log"
        self.log = open(self.log_path, "wb")
        # Both render gpt-oss's Harmony preamble with a `Current date:` line: pin it.
        env = dict(os.environ)
        env.setdefault("VLLM_SYSTEM_START_DATE", HARMONY_START_DATE)
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env)

    def wait_ready(self, deadline):
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.label} exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                st, _, _ = http_call(self.port, "GET", "/health", None, {}, timeout=2)
                if st == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.label} not ready in time:\n{self.log_tail()}")

    def log_tail(self, n=30):
        self.log.flush()
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def http_call(port, method, path, body, headers, timeout=120):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers)
        r = conn.getresponse()
        return r.status, r.getheader("content-type"), r.read()
    finally:
        conn.close()


# --- corpus ----------------------------------------------------------------------------------

def eval_count(n, ctx):
    if isinstance(n, int):
        return n
    m = re.fullmatch(r"\s*max_model_len\s*(?:([+*-])\s*(\d+))?\s*", str(n))
    if not m:
        raise ValueError(f"bad count expression {n!r}")
    v = ctx["max_model_len"]
    if m.group(1) == "+":
        v += int(m.group(2))
    elif m.group(1) == "-":
        v -= int(m.group(2))
    elif m.group(1) == "*":
        v *= int(m.group(2))
    return v


def expand(node, defs, ctx):
    if isinstance(node, str):
        return ctx["model"] if node == "$MODEL" else node
    if isinstance(node, list):
        return [expand(x, defs, ctx) for x in node]
    if isinstance(node, dict):
        if "$def" in node:
            return expand(defs[node["$def"]], defs, ctx)
        if "$repeat" in node:
            return node["$repeat"] * eval_count(node["times"], ctx)
        if "$repeat_list" in node:
            return [expand(node["$repeat_list"], defs, ctx)] * eval_count(node["times"], ctx)
        if "$int" in node:
            return eval_count(node["$int"], ctx)
        return {k: expand(v, defs, ctx) for k, v in node.items()}
    return node


def build_request(entry, defs, ctx):
    method = entry.get("method", "POST")
    headers = dict(entry.get("headers", {}))
    body = None
    if "raw_body" in entry:
        body = entry["raw_body"].replace("$MODEL", ctx["model"]).encode("utf-8")
    elif "body" in entry:
        body = json.dumps(expand(entry["body"], defs, ctx), ensure_ascii=False).encode("utf-8")
    if body is not None:
        headers.setdefault("Content-Type", entry.get("content_type", "application/json"))
    return method, entry["path"], body, headers


# --- diffing ---------------------------------------------------------------------------------

class Num(str):
    """A JSON float kept as its spelling, so 1 vs 1.0 and 0.7 vs 0.699999988 differ."""


def parse_json(raw: bytes):
    return json.loads(raw.decode("utf-8"), parse_float=Num)


def shape_of(s: str) -> str:
    if re.fullmatch(r"[0-9a-f-]{36}", s) and s.count("-") == 4:
        return "<uuid>"
    if re.fullmatch(r"[0-9a-f]+", s):
        return f"<{len(s)} hex>"
    if re.fullmatch(r"[0-9a-fA-F]+", s):
        return f"<{len(s)} HEX>"
    return f"<{len(s)} chars>"


def normalize_random(node, path=""):
    """Replace random-by-nature values by their shape; returns (new node, [(old, new) raw])."""
    subs = []

    def walk(n, p):
        if isinstance(n, dict):
            return {k: walk(v, f"{p}.{k}") for k, v in n.items()}
        if isinstance(n, list):
            return [walk(v, f"{p}[{i}]") for i, v in enumerate(n)]
        for prx, vrx in RANDOM_FIELDS:
            if re.search(prx, p) and isinstance(n, (str, int)) and not isinstance(n, bool):
                m = re.search(vrx, str(n))
                if m:
                    if "r" in m.groupdict() and m.group("r") is not None:
                        new = str(n)[:m.start("r")] + shape_of(m.group("r")) + str(n)[m.end("r"):]
                    else:
                        new = "<random int>" if isinstance(n, int) else shape_of(str(n))
                    subs.append((json.dumps(n), json.dumps(new)))
                    return new
        return n

    return walk(node, path), subs


def dumps(v):
    """JSON text of a parsed value, floats spelled as they came (Num is a str subclass)."""
    def mark(n):
        if isinstance(n, Num):
            return f"\x00N{n}\x00"
        if isinstance(n, dict):
            return {k: mark(x) for k, x in n.items()}
        if isinstance(n, list):
            return [mark(x) for x in n]
        return n
    return re.sub(r'"\\u0000N(.*?)\\u0000"', r"\1", json.dumps(mark(v), ensure_ascii=False, default=str))


def fmt(v, width=60):
    if v is ABSENT:
        return "<absent>"
    s = dumps(v)
    s = s.replace("\n", "\\n")
    return s if len(s) <= width else s[: width - 1] + "…"


class _Absent:
    pass


ABSENT = _Absent()


def same_scalar(a, b):
    return type(a) is type(b) and a == b


def diff(a, b, path=""):
    """Field-by-field differences: [(path, value_a, value_b)]."""
    out = []
    if isinstance(a, dict) and isinstance(b, dict):
        for k in list(a) + [k for k in b if k not in a]:
            out += diff(a.get(k, ABSENT), b.get(k, ABSENT), f"{path}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        scalars = all(not isinstance(x, (dict, list)) for x in a + b)
        if scalars:
            if len(a) != len(b) or any(not same_scalar(x, y) for x, y in zip(a, b)):
                out.append((path, a, b))
            return out
        for i in range(max(len(a), len(b))):
            out += diff(a[i] if i < len(a) else ABSENT, b[i] if i < len(b) else ABSENT, f"{path}[{i}]")
        return out
    if isinstance(a, (dict, list)) or isinstance(b, (dict, list)):
        if a != b:
            out.append((path, a, b))
        return out
    if not same_scalar(a, b):
        out.append((path, a, b))
    return out


def list_detail(a, b):
    """For two differing scalar lists: lengths and the first differing index."""
    if not (isinstance(a, list) and isinstance(b, list)):
        return ""
    i = next((i for i, (x, y) in enumerate(zip(a, b)) if not same_scalar(x, y)), min(len(a), len(b)))
    xa = fmt(a[i], 20) if i < len(a) else "<end>"
    xb = fmt(b[i], 20) if i < len(b) else "<end>"
    return f"len {len(a)} vs {len(b)}; first diff at [{i}]: {xa} vs {xb}"


def compare(res_a, res_b, lenient_mode=False):
    """res = (status, content_type, raw). Returns [(path, va, vb, detail)]."""
    (sa, _, ra), (sb, _, rb) = res_a, res_b
    out = []
    if sa != sb:
        out.append(("<status>", sa, sb, ""))
    try:
        ja, jb = parse_json(ra), parse_json(rb)
    except (ValueError, UnicodeDecodeError):
        if ra != rb:
            out.append(("<body>", ra.decode("utf-8", "replace"), rb.decode("utf-8", "replace"), "not JSON"))
        return out
    na, subs_a = normalize_random(ja)
    nb, subs_b = normalize_random(jb)
    if lenient_mode:
        na, nb = lenient(na), lenient(nb)
    for p, va, vb in diff(na, nb):
        out.append((p or ".", va, vb, list_detail(va, vb)))
    if not lenient_mode and (not out or out == [("<status>", sa, sb, "")]):
        # Same JSON: are the bytes the same too (key order, number spelling, whitespace)?
        xa, xb = ra.decode("utf-8"), rb.decode("utf-8")
        for old, new in subs_a:
            xa = xa.replace(old, new)
        for old, new in subs_b:
            xb = xb.replace(old, new)
        if xa != xb:
            i = next((i for i, (x, y) in enumerate(zip(xa, xb)) if x != y), min(len(xa), len(xb)))
            out.append(("<bytes>", xa[max(0, i - 20): i + 40], xb[max(0, i - 20): i + 40],
                        f"same JSON, different serialization at byte {i}"))
    return out


# --lenient (an analysis lens, never the default): values a consumer cannot tell from an
# absent key. A GenerateRequest key whose value is its wire default, and a sampling_params key
# whose value is msgspec's SamplingParams default (or the post-init spelling of it), are dropped
# from both answers before the diff, and so are nulls anywhere.
LENIENT_REQUEST_DEFAULTS = {"output_mode": ["tokens"], "stream": [False], "priority": [0]}
LENIENT_SAMPLING_DEFAULTS = {
    "n": [1], "presence_penalty": [0, "0.0"], "frequency_penalty": [0, "0.0"],
    "repetition_penalty": [1, "1.0"], "temperature": [1, "1.0"], "top_p": [1, "1.0"],
    "top_k": [0], "min_p": [0, "0.0"], "stop": [[]], "stop_token_ids": [[]], "bad_words": [[]],
    "ignore_eos": [False], "min_tokens": [0], "detokenize": [True], "skip_special_tokens": [True],
    "spaces_between_special_tokens": [True], "include_stop_str_in_output": [False],
    "output_kind": [0], "skip_clone": [False], "output_text_buffer_length": [0],
    "flat_logprobs": [False], "routed_experts_prompt_start": [0],
}


def lenient(node, in_sampling=False):
    if isinstance(node, list):
        return [lenient(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for k, v in node.items():
        if v is None:
            continue
        if in_sampling and k in LENIENT_SAMPLING_DEFAULTS and any(
                same_scalar(v, d) or (isinstance(v, Num) and str(d) == v) or v == d and isinstance(v, list)
                for d in LENIENT_SAMPLING_DEFAULTS[k]):
            continue
        if not in_sampling and "token_ids" in node and k in LENIENT_REQUEST_DEFAULTS and any(
                same_scalar(v, d) for d in LENIENT_REQUEST_DEFAULTS[k]):
            continue
        out[k] = lenient(v, in_sampling=(k == "sampling_params"))
    return out


def documented(name, path, va=ABSENT, vb=ABSENT, status=None, spec=""):
    for d in DOCUMENTED_DIFFERENCES:
        if not (fnmatch.fnmatchcase(name, d["request"]) and re.search(d["path"], path)):
            continue
        if "status" in d and tuple(d["status"]) != tuple(status or ()):
            continue
        if "model" in d and not fnmatch.fnmatchcase(spec, d["model"]):
            continue
        if "aphro" in d and not re.fullmatch(d["aphro"], fmt(va, width=1 << 30)):
            continue
        if "vllm_rs" in d and not re.fullmatch(d["vllm_rs"], fmt(vb, width=1 << 30)):
            continue
        return ("known gap: " if d.get("gap") else "") + d["reason"]
    return None


# --- running ---------------------------------------------------------------------------------

def parse_model_spec(spec):
    parts = spec.split(",")
    target, opts = parts[0], {}
    for p in parts[1:]:
        k, _, v = p.partition("=")
        if k not in ("tool", "reasoning", "vllm_tool", "vllm_reasoning", "max_model_len", "aphro_model"):
            sys.exit(f"model spec `{spec}`: unknown option `{k}`")
        opts[k] = v
    if target.startswith("fixture:"):
        path = assemble_fixture(target[len("fixture:"):])
    elif target.startswith("arch:"):
        path = resolve_arch(target[len("arch:"):])
    else:
        path = Path(target)
        if not (path / "config.json").is_file():
            sys.exit(f"{target}: not a model directory (no config.json)")
    return target, path, opts


def server_argvs(aphro, vllm_rs, model, opts, max_model_len, port_aphro, port_vllm):
    """The two servers' command lines for one model spec's options: the same model directory
    and context length; the parsers each names its own way (aphro also needs
    --enable-auto-tool-choice, which vllm-rs has no flag for; vllm-rs gets `none` where the
    spec names no parser, because its default is `auto`)."""
    common = ["--max-model-len", str(max_model_len)] if max_model_len is not None else []
    vllm_extra, aphro_extra = [], []
    if opts.get("tool"):
        aphro_extra += ["--tool-call-parser", opts["tool"], "--enable-auto-tool-choice"]
    if opts.get("reasoning"):
        aphro_extra += ["--reasoning-parser", opts["reasoning"]]
    for flag, key in (("--tool-call-parser", "tool"), ("--reasoning-parser", "reasoning")):
        name = opts.get(f"vllm_{key}", opts.get(key) or "none")
        if name != "auto":
            vllm_extra += [flag, name]
    aphro_model = model
    if opts.get("aphro_model"):
        aphro_model = opts["aphro_model"]
        aphro_extra += ["--served-model-name", model]
    argv_a = [str(aphro), "launch", "render", aphro_model, "--port", str(port_aphro)] + common + aphro_extra
    argv_v = [str(vllm_rs), "render", model, "--port", str(port_vllm)] + common + vllm_extra
    return argv_a, argv_v


def run_model(spec, args, corpus, log_root):
    label, path, opts = parse_model_spec(spec)
    cfg = json.loads((path / "config.json").read_text())
    mml = opts.get("max_model_len", args.max_model_len)
    cfg_len = max_model_len_from_config(cfg)
    if mml == "config":
        mml_flag = cfg_len
    elif mml == "none":
        mml_flag = None
    else:
        mml_flag = int(mml)
    model = str(path)
    ctx = {"model": model, "max_model_len": mml_flag or cfg_len or 4096}

    log_dir = Path(log_root) / re.sub(r"[^A-Za-z0-9_.-]+", "_", spec)
    log_dir.mkdir(parents=True, exist_ok=True)
    pa, pv = free_port(), free_port()
    argv_a, argv_v = server_argvs(args.aphro, args.vllm_rs, model, opts, mml_flag, pa, pv)
    argv_a += args.aphro_arg
    argv_v += args.vllm_rs_arg
    print(f"\n## {spec}\n  aphro:   {' '.join(argv_a)}\n  vllm-rs: {' '.join(argv_v)}", flush=True)
    t0 = time.time()
    servers = []
    try:
        servers.append(Server("aphro", argv_a, pa, log_dir))
        servers.append(Server("vllm-rs", argv_v, pv, log_dir))
        for s in servers:
            s.wait_ready(t0 + args.startup_timeout)
        t_ready = time.time() - t0
        rows = []
        for entry in corpus["requests"]:
            if args.only and not any(re.search(o, entry["name"]) for o in args.only):
                continue
            method, rpath, body, headers = build_request(entry, corpus.get("defs", {}), ctx)
            res = {}
            for s in servers:
                try:
                    res[s.label] = http_call(s.port, method, rpath, body, headers, args.request_timeout)
                except OSError as e:
                    res[s.label] = (0, None, f"<transport error: {e}>".encode())
                if s.proc.poll() is not None:
                    raise RuntimeError(f"{s.label} died on {entry['name']}:\n{s.log_tail()}")
            diffs = compare(res["aphro"], res["vllm-rs"], args.lenient)
            rows.append({"name": entry["name"], "status": (res["aphro"][0], res["vllm-rs"][0]),
                         "diffs": [(p, va, vb, det, documented(entry["name"], p, va, vb, (res["aphro"][0], res["vllm-rs"][0]), spec))
                                   for p, va, vb, det in diffs],
                         "bodies": (res["aphro"][2], res["vllm-rs"][2]), "request": body,
                         "method": method, "path": rpath})
        return {"spec": spec, "model": model, "argv": {"aphro": argv_a, "vllm-rs": argv_v},
                "ready_s": t_ready, "total_s": time.time() - t0, "rows": rows, "log_dir": str(log_dir)}
    finally:
        for s in servers:
            s.stop()


def print_table(result, show_identical, width):
    rows = result["rows"]
    nw = max([len(r["name"]) for r in rows] + [7])
    print(f"\n{'request':<{nw}}  aphro  vllm-rs  result")
    print(f"{'-' * nw}  -----  -------  {'-' * 40}")
    n_same = n_doc = n_bad = n_gap = 0
    for r in rows:
        sa, sv = r["status"]
        undoc = [d for d in r["diffs"] if d[4] is None]
        if not r["diffs"]:
            n_same += 1
            if show_identical:
                print(f"{r['name']:<{nw}}  {sa:>5}  {sv:>7}  identical")
            continue
        if undoc:
            n_bad += 1
        elif any(d[4].startswith("known gap: ") for d in r["diffs"]):
            n_gap += 1
        else:
            n_doc += 1
        first = True
        for p, va, vb, det, reason in r["diffs"]:
            head = f"{r['name']:<{nw}}  {sa:>5}  {sv:>7}" if first else " " * (nw + 16)
            tag = f"[documented: {reason}] " if reason else ""
            print(f"{head}  {tag}{p}: aphro={fmt(va, width)} vllm-rs={fmt(vb, width)}" + (f" ({det})" if det else ""))
            first = False
    print_summary(rows, width)
    print(f"\n{len(rows)} requests: {n_same} identical, {n_doc} with documented differences only, "
          f"{n_gap} with known gaps, {n_bad} with undocumented differences; servers ready in {result['ready_s']:.1f}s, "
          f"run {result['total_s']:.1f}s")
    return n_bad


def print_summary(rows, width):
    """The same differences grouped by JSON path (array indices folded to [*]), to see causes."""
    by_path = {}
    for r in rows:
        for p, va, vb, _, reason in r["diffs"]:
            key = re.sub(r"\[\d+\]", "[*]", p)
            e = by_path.setdefault(key, {"requests": [], "pairs": {}, "documented": reason})
            if r["name"] not in e["requests"]:
                e["requests"].append(r["name"])
            pair = (fmt(va, width // 2), fmt(vb, width // 2))
            e["pairs"][pair] = e["pairs"].get(pair, 0) + 1
    if not by_path:
        return
    print(f"\nby path ({len(by_path)} paths):")
    for key, e in sorted(by_path.items(), key=lambda kv: (-len(kv[1]["requests"]), kv[0])):
        names = e["requests"]
        shown = ", ".join(names[:4]) + (f", +{len(names) - 4} more" if len(names) > 4 else "")
        print(f"  {key}  [{len(names)} request(s): {shown}]")
        for (a, b), n in sorted(e["pairs"].items(), key=lambda kv: -kv[1])[:3]:
            print(f"      {n:>3}x aphro={a} vllm-rs={b}")
        if len(e["pairs"]) > 3:
            print(f"      ... {len(e['pairs']) - 3} more value pairs")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("models", nargs="+", metavar="MODEL", help="model directory, fixture:NAME or arch:NAME (with ,opt=val ...)")
    ap.add_argument("--vllm-rs", default=os.environ.get("APHRO_VLLM_RS"),
                    help="vllm-rs binary (env APHRO_VLLM_RS)")
    ap.add_argument("--fetch", action="store_true",
                    help=f"use vllm-rs from the pinned vllm=={VLLM_VERSION} wheel (pip download, sha256-checked, cached)")
    ap.add_argument("--aphro", default=os.environ.get("APHRO_BIN"),
                    help="aphro binary (env APHRO_BIN; default: the newer of target/{release,debug}/aphro)")
    ap.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    ap.add_argument("--only", action="append", default=[], metavar="REGEX", help="only requests whose name matches (repeatable)")
    ap.add_argument("--max-model-len", default="config", help="config (default) | none | N; per model: ,max_model_len=")
    ap.add_argument("--aphro-arg", action="append", default=[], help="extra argument for aphro (repeatable)")
    ap.add_argument("--vllm-rs-arg", action="append", default=[], help="extra argument for vllm-rs (repeatable)")
    ap.add_argument("--startup-timeout", type=float, default=300)
    ap.add_argument("--request-timeout", type=float, default=120)
    ap.add_argument("--lenient", action="store_true",
                    help="analysis lens: treat nulls and wire-default values as absent (see LENIENT_*); "
                         "not the compatibility verdict")
    ap.add_argument("--show-identical", action="store_true", help="list identical answers too")
    ap.add_argument("--width", type=int, default=70, help="characters per shown value")
    ap.add_argument("--json-report", metavar="FILE", help="write every request, both answers and the diffs as JSON")
    ap.add_argument("--log-dir", help="keep the server logs here (default: a temporary directory, removed)")
    args = ap.parse_args()

    if args.fetch:
        args.vllm_rs = str(fetch_vllm_rs())
    if not args.vllm_rs:
        sys.exit("no vllm-rs binary: pass --vllm-rs, set APHRO_VLLM_RS, or use --fetch")
    args.aphro = Path(args.aphro) if args.aphro else default_aphro()
    corpus = json.loads(Path(args.corpus).read_text(encoding="utf-8"))

    log_root = args.log_dir or tempfile.mkdtemp(prefix="render-compare-")
    t0 = time.time()
    results, bad = [], 0
    try:
        for spec in args.models:
            try:
                result = run_model(spec, args, corpus, log_root)
            except RuntimeError as e:
                print(f"  could not run {spec}: {e}", flush=True)
                bad += 1
                continue
            results.append(result)
            bad += print_table(result, args.show_identical, args.width)
    finally:
        if not args.log_dir:
            shutil.rmtree(log_root, ignore_errors=True)
    if args.json_report:
        def dec(b):
            return None if b is None else b.decode("utf-8", "replace")
        rep = [{"spec": r["spec"], "model": r["model"], "argv": r["argv"], "ready_s": r["ready_s"],
                "total_s": r["total_s"],
                "rows": [{"name": x["name"], "method": x["method"], "path": x["path"],
                          "status": x["status"], "request": dec(x["request"]),
                          "aphro": dec(x["bodies"][0]), "vllm_rs": dec(x["bodies"][1]),
                          "diffs": [{"path": p, "aphro": fmt(va, 10 ** 6), "vllm_rs": fmt(vb, 10 ** 6),
                                     "detail": det, "documented": why} for p, va, vb, det, why in x["diffs"]]}
                         for x in r["rows"]]} for r in results]
        Path(args.json_report).write_text(json.dumps(rep, indent=1, ensure_ascii=False) + "\n")
    print(f"\ntotal {time.time() - t0:.1f}s; {'FAIL' if bad else 'OK'}: "
          f"{bad} request(s)/model(s) with undocumented differences")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
