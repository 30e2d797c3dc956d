#!/usr/bin/env python3
"""Image render throughput on one thread: aphro next to vLLM's own Python render path.

Renders a chat with one JPEG (`data:` URL) for Qwen2-VL (the fixture model files of
testdata/multimodal: config, preprocessor config, chat template, the Qwen tokenizer), to the
`GenerateRequest` with `features` (mm_hashes, mm_placeholders, kwargs_data, mm_metadata):

* aphro: `aphro.Renderer(...).render_chat(body)` (the Python binding; Rust underneath).
* vLLM:  `ServingRender.render_chat_request(ChatCompletionRequest(**body))` + `model_dump()`,
  built in-process exactly as `vllm launch render` builds it (`init_render_app_state`), so
  the same media loading, HF processor (transformers' `Qwen2VLImageProcessor`), hashing and
  msgpack/base64 encoding run as in vLLM's render server, minus the HTTP socket.

Every timed render is of a JPEG not rendered before (a comment segment differs), so vLLM's
processor cache cannot answer from memory. Both run in this process on one thread (`OMP_NUM_THREADS=1`, `torch.set_num_threads(1)`), one
request at a time, after checking both give the same token ids and mm_hashes. Images: the
fixture 640x480 JPEG and a 1920x1080 quality-90 JPEG drawn with Pillow.

Needs a venv with aphro (`pip install ./python`) and vllm==0.33.0 with its render-path deps
(torch, torchvision, transformers, pillow, msgspec, blake3, pybase64, fastapi, ...):

    python scripts/bench_mm_render.py [--seconds 5]
"""
import argparse
import asyncio
import base64
import io
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parent.parent
MM = ROOT / "testdata" / "multimodal"
MODEL = "Qwen/Qwen2-VL-2B-Instruct"


def jpeg_1920x1080() -> bytes:
    """A photo-like 1920x1080 JPEG (gradients and fine texture), quality 90 baseline."""
    from PIL import Image

    w, h = 1920, 1080
    img = Image.new("RGB", (w, h))
    px = img.load()
    for y in range(h):
        for x in range(w):
            t = (x * 7 + y * 13) % 31
            px[x, y] = ((x * 255 // w) ^ t, y * 255 // h, (x + y) % 256)
    out = io.BytesIO()
    img.save(out, format="JPEG", quality=90)
    return out.getvalue()


def body(jpeg: bytes) -> dict:
    url = "data:image/jpeg;base64," + base64.b64encode(jpeg).decode()
    return {
        "model": MODEL,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": url}},
                    {"type": "text", "text": "Describe this image."},
                ],
            }
        ],
    }


def model_root(assets: Path) -> Path:
    """`<tmp>/Qwen/Qwen2-VL-2B-Instruct`: served as the relative path `MODEL`, so the model
    id in every mm_hash is the hub id on both sides."""
    root = Path(tempfile.mkdtemp(prefix="mm-bench-"))
    dest = root / MODEL
    shutil.copytree(MM / "models" / MODEL.split("/")[1], dest)
    shutil.copy(assets / "tokenizers" / "qwen3" / "tokenizer.json", dest / "tokenizer.json")
    return root


def variants(jpeg: bytes, count: int) -> list[dict]:
    """`count` request bodies whose JPEGs differ only in a comment segment (COM, ignored by
    decoders): every render gets a new mm_hash, so no cache keyed on it (vLLM's processor
    cache) can skip the work."""
    assert jpeg[:2] == b"\xff\xd8"
    out = []
    for i in range(count):
        note = f"variant {i}".encode()
        com = b"\xff\xfe" + (len(note) + 2).to_bytes(2, "big") + note
        out.append(body(jpeg[:2] + com + jpeg[2:]))
    return out


def kwargs_items(rendered: dict) -> dict:
    """`kwargs_data` decoded (base64, then msgpack): vLLM writes an item's two keys in an
    order that changes from one process to the next (it follows Python's string hashing), so
    the check compares the decoded maps (every tensor's bytes), not the base64 text."""
    import msgspec

    return {
        modality: [msgspec.msgpack.decode(base64.b64decode(item)) for item in items]
        for modality, items in rendered["features"]["kwargs_data"].items()
    }


def timed(render, bodies: list[dict], seconds: float, min_iters: int = 3) -> tuple[float, int]:
    """(images per second, iterations) over at least `seconds` and `min_iters` renders, each
    of a body not rendered before."""
    render(bodies[0])  # warm-up
    n, start = 0, time.perf_counter()
    while n < min_iters or time.perf_counter() - start < seconds:
        render(bodies[1 + n % (len(bodies) - 1)])
        n += 1
        if n == len(bodies) - 1:
            break
    return n / (time.perf_counter() - start), n


def vllm_renderer():
    import torch

    torch.set_num_threads(1)
    from starlette.datastructures import State

    from vllm import AsyncEngineArgs, envs
    from vllm.config import VllmConfig
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.entrypoints.launchers.render.app_state import init_render_app_state
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    # `vllm launch render MODEL`, as `run_launch_fastapi` configures it.
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", MODEL])
    engine_args = AsyncEngineArgs.from_cli_args(args)
    model_config = engine_args.create_model_config()
    model_config.quantization = None
    envs.VLLM_CPU_KVCACHE_SPACE = 0
    vllm_config = VllmConfig(
        model_config=model_config,
        logging_config=engine_args.create_logging_config(),
        structured_outputs_config=engine_args.create_structured_outputs_config(),
    )
    state = State()
    loop = asyncio.new_event_loop()
    loop.run_until_complete(init_render_app_state(vllm_config, state, args))
    serving = state.serving_render

    def render(b: dict) -> dict:
        out = loop.run_until_complete(serving.render_chat_request(ChatCompletionRequest(**b)))
        d = out.model_dump()
        if "error" in d:
            raise RuntimeError(d)
        return d

    return render


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="time per case and side")
    ap.add_argument("--label", default="busy machine", help="note printed with the table")
    ap.add_argument("--variants", type=int, default=400, help="distinct JPEGs per case")
    args = ap.parse_args()
    assets = Path(os.environ.get("APHRO_ASSETS", ROOT / ".assets"))
    root = model_root(assets)
    os.chdir(root)
    import aphro

    ours = aphro.Renderer(MODEL)
    theirs = vllm_renderer()
    cases = [
        ("640x480 JPEG", (MM / "images" / "scene_640x480.jpg").read_bytes()),
        ("1920x1080 JPEG", jpeg_1920x1080()),
    ]
    rows = []
    for name, jpeg in cases:
        b = body(jpeg)
        a, v = ours.render_chat(b), theirs(b)
        assert a["token_ids"] == v["token_ids"], f"{name}: token ids differ"
        assert a["features"]["mm_hashes"] == v["features"]["mm_hashes"], f"{name}: hashes differ"
        same_pixels = kwargs_items(a) == kwargs_items(v)
        if not same_pixels:
            print(f"warning: {name}: kwargs_data differs from vLLM's", file=sys.stderr)
        bodies = variants(jpeg, args.variants)
        ra, na = timed(ours.render_chat, bodies, args.seconds)
        rv, nv = timed(theirs, bodies, args.seconds)
        rows.append((name, len(jpeg), a["features"]["mm_placeholders"]["image"][0]["length"],
                     same_pixels, ra, na, rv, nv))
    print(f"\nImage render, one thread, one request at a time ({args.label}; "
          f"vllm {__import__('vllm').__version__}, aphro {aphro.__version__})\n")
    print("| image | file bytes | tokens | kwargs_data equal | aphro images/s | vLLM images/s "
          "| aphro / vLLM |")
    print("|---|---:|---:|---|---:|---:|---:|")
    for name, size, toks, same, ra, na, rv, nv in rows:
        print(f"| {name} | {size} | {toks} | {'yes' if same else 'NO'} | {ra:.1f} (n={na}) "
              f"| {rv:.2f} (n={nv}) | {ra / rv:.1f}x |")
    shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
