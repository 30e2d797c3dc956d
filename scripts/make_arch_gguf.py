#!/usr/bin/env python3
"""GGUF copies of the `phi3` and `granite` architecture fixtures (testdata/arch/models), written
the way llama.cpp's `convert_hf_to_gguf.py` converts those classes, with llama.cpp's own
`gguf-py` (tensor names from its `get_tensor_name_map`, metadata keys from its writer):

* `Phi3ForCausalLM` (`Phi3MiniModel`): arch `phi3`, the fused `qkv_proj` and `gate_up_proj`
  kept fused (`attn_qkv`, `ffn_up`), no Q/K permutation, `phi3.attention.sliding_window` 0
  when the config has none, `phi3.rope.scaling.original_context_length`.
* `GraniteForCausalLM` (`GraniteModel`, a `LlamaModel`): arch `granite`, Q/K rows permuted as
  `LlamaModel.permute` does, the multipliers as `granite.{attention.scale, embedding_scale,
  residual_scale, logit_scale}`.

Tensors stay float32 and no tokenizer is stored (`{arch}.vocab_size` gives the size): the
weights are the fixture's, so the HF goldens hold for the GGUF too.

    python3 scripts/make_arch_gguf.py [--gguf-py DIR]

DIR defaults to the gguf-py of the llama-cpp-python 0.3.16 sdist that
scripts/bench_llamacpp.sh unpacks (~/.cache/aphro/llama.cpp/llama_cpp_python-0.3.16/vendor/
llama.cpp/gguf-py). Writes testdata/arch/gguf/{phi3,granite}.f32.gguf. Needs numpy.
"""
import argparse
import json
import struct
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "testdata/arch/models"
DEFAULT_GGUF_PY = (Path.home() / ".cache/aphro/llama.cpp/llama_cpp_python-0.3.16/vendor/llama.cpp/gguf-py")


def read_safetensors(path):
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        assert meta["dtype"] == "F32", (name, meta["dtype"])
        a, b = meta["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + a:8 + n + b], dtype="<f4").reshape(meta["shape"]).copy()
    return out


def llama_permute(w, n_head, n_head_kv):
    """convert_hf_to_gguf.py's `LlamaModel.permute`."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def convert(gguf, name):
    cfg = json.loads((MODELS / name / "config.json").read_text())
    arch = {"phi3": gguf.MODEL_ARCH.PHI3, "granite": gguf.MODEL_ARCH.GRANITE}[name]
    out = ROOT / "testdata/arch/gguf" / f"{name}.f32.gguf"
    w = gguf.GGUFWriter(str(out), gguf.MODEL_ARCH_NAMES[arch])
    n_layer, n_embd = cfg["num_hidden_layers"], cfg["hidden_size"]
    n_head, n_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_block_count(n_layer)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_vocab_size(cfg["vocab_size"])
    w.add_eos_token_id(cfg["eos_token_id"])
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    if name == "phi3":
        rot = cfg.get("partial_rotary_factor", 1.0)
        w.add_rope_dimension_count(int(rot * n_embd) // n_head)
        w.add_rope_scaling_orig_ctx_len(cfg["original_max_position_embeddings"])
        w.add_sliding_window(cfg.get("sliding_window") or 0)
    else:
        w.add_rope_dimension_count(n_embd // n_head)
        w.add_attention_scale(cfg["attention_multiplier"])
        w.add_embedding_scale(cfg["embedding_multiplier"])
        w.add_residual_scale(cfg["residual_multiplier"])
        w.add_logit_scale(cfg["logits_scaling"])
    names = gguf.get_tensor_name_map(arch, n_layer)
    for hf, t in read_safetensors(MODELS / name / "model.safetensors").items():
        if name == "granite" and hf.endswith("q_proj.weight"):
            t = llama_permute(t, n_head, n_head)
        elif name == "granite" and hf.endswith("k_proj.weight"):
            t = llama_permute(t, n_head, n_kv)
        new = names.get_name(hf, try_suffixes=(".weight", ".bias"))
        if new is None:
            raise SystemExit(f"{name}: no GGUF name for {hf}")
        w.add_tensor(new, np.ascontiguousarray(t, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(out.relative_to(ROOT), out.stat().st_size, "bytes")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf-py", default=str(DEFAULT_GGUF_PY))
    a = ap.parse_args()
    sys.path.insert(0, a.gguf_py)
    import gguf

    for name in ("phi3", "granite"):
        convert(gguf, name)


if __name__ == "__main__":
    main()
