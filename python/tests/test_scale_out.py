"""Scale-out with the tools people already run: aphro engines behind the vLLM router
(`vllm-router==0.1.17` from PyPI, the Rust router of the vLLM project), and aphro's KV-cache
event stream read by a subscriber written from vLLM's own definitions (Python `msgspec`
structs of vLLM 0.33.0's `vllm/distributed/kv_events.py`, `pyzmq`).

Every engine is a real `aphro serve` on the test GGUF; which engine served a request is read
from each engine's `/metrics` (vLLM's `vllm:request_success_total`), never from the router.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from conftest import DEFAULT_GGUF, REPO, SMOL, aphro_process, free_port

sys.path.insert(0, str(REPO / "scripts"))
import make_kv_event_goldens as vllm_kv  # noqa: E402  (vLLM 0.33.0's structs and hashes)

BLOCK = 16
ENGINE_FLAGS = [
    "--served-model-name", SMOL,
    "--kv-cache-memory", "33554432",
    "--max-model-len", "auto",
    "--max-num-seqs", "8",
    "--enable-prefix-caching",
    "--prefix-caching-hash-algo", "sha256_cbor",
    "--block-size", str(BLOCK),
]
# vLLM's settings for a router that checks hashes: a shared NONE_HASH seed, full digests.
KV_ENV = {"PYTHONHASHSEED": "0", "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES": "0",
          # vLLM's development routes, for POST /reset_prefix_cache.
          "VLLM_SERVER_DEV_MODE": "1"}


def _router_binary() -> str:
    path = shutil.which("vllm-router") or str(Path(sys.executable).parent / "vllm-router")
    if not os.access(path, os.X_OK):
        if os.environ.get("CI"):
            pytest.fail("vllm-router is not installed (scripts/test.sh installs vllm-router==0.1.17)")
        pytest.skip("vllm-router is not installed (pip install vllm-router==0.1.17)")
    return path


class Engine:
    def __init__(self, base: str, proc: subprocess.Popen, events: str, replay: str):
        self.base, self.proc, self.events, self.replay = base, proc, events, replay

    def counter(self, name: str) -> float:
        """Sum of a vLLM counter over its label sets."""
        text = httpx.get(f"{self.base}/metrics", timeout=10).text
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def served(self) -> float:
        return self.counter("vllm:request_success_total")

    def prefix_hits(self) -> float:
        return self.counter("vllm:prefix_cache_hits_total")


@contextlib.contextmanager
def engines(n: int, topic: str = "", connect_to: str | None = None):
    """`n` engines, each publishing KV events on its own PUB port with a replay socket. The
    vLLM router reads events under vLLM's default topic, the empty one. With `connect_to`,
    the engines' PUB sockets connect to that endpoint instead of binding (llm-d's indexer
    binds its SUB)."""
    with contextlib.ExitStack() as stack:
        out = []
        for _ in range(n):
            pub, rep = free_port(), free_port()
            cfg = {
                "enable_kv_cache_events": True,
                "publisher": "zmq",
                "endpoint": connect_to or f"tcp://*:{pub}",
                "replay_endpoint": f"tcp://*:{rep}",
                "topic": topic,
            }
            base, proc = stack.enter_context(
                aphro_process("serve", str(DEFAULT_GGUF), *ENGINE_FLAGS,
                              "--kv-events-config", json.dumps(cfg), env=KV_ENV)
            )
            out.append(Engine(base, proc, f"tcp://127.0.0.1:{pub}", f"tcp://127.0.0.1:{rep}"))
        yield out


@contextlib.contextmanager
def router(workers: list[Engine], *args: str):
    port = free_port()
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(
        [_router_binary(), "--host", "127.0.0.1", "--port", str(port),
         "--prometheus-port", str(free_port()),
         "--worker-urls", *[w.base for w in workers], *args],
        stdout=log, stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while True:
            if proc.poll() is not None:
                log.seek(0)
                pytest.fail(f"vllm-router exited: {log.read().decode(errors='replace')[-3000:]}")
            try:
                if httpx.get(f"{base}/v1/models", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                pytest.fail("vllm-router did not start")
            time.sleep(0.2)
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def chat(base: str, text: str, session: str | None = None, timeout: float = 60) -> httpx.Response:
    headers = {"X-Session-ID": session} if session else {}
    return httpx.post(
        f"{base}/v1/chat/completions",
        json={"model": SMOL, "messages": [{"role": "user", "content": text}], "max_tokens": 2},
        headers=headers,
        timeout=timeout,
    )


def complete_ids(base: str, ids: list[int]) -> httpx.Response:
    return httpx.post(
        f"{base}/v1/completions",
        json={"model": SMOL, "prompt": ids, "max_tokens": 1},
        timeout=60,
    )


def which(workers: list[Engine], before: list[float]) -> int:
    """The one engine whose served count went up by exactly one since `before`."""
    after = [w.served() for w in workers]
    moved = [i for i, (a, b) in enumerate(zip(after, before)) if a != b]
    assert len(moved) == 1 and after[moved[0]] - before[moved[0]] == 1, (before, after)
    return moved[0]


def test_consistent_hash_pins_every_turn_of_a_session_to_one_engine():
    with engines(2) as ws, router(ws, "--policy", "consistent_hash") as r:
        homes: dict[str, int] = {}
        for turn in range(3):
            for s in range(10):
                before = [w.served() for w in ws]
                resp = chat(r, f"turn {turn} of session {s}", session=f"session-{s}")
                assert resp.status_code == 200, resp.text
                e = which(ws, before)
                assert homes.setdefault(f"session-{s}", e) == e, f"session-{s} moved engines"
        # Ten sessions over two engines: both get some (the ring hashes the worker URLs).
        assert set(homes.values()) == {0, 1}, homes


def test_cache_aware_sends_a_repeated_prefix_to_the_engine_that_cached_it():
    system = "You are a careful assistant who answers questions about gardening. " * 12
    with engines(2) as ws, router(ws, "--policy", "cache_aware") as r:
        picks = []
        hits_before = [w.prefix_hits() for w in ws]
        for q in range(5):
            before = [w.served() for w in ws]
            resp = httpx.post(
                f"{r}/v1/chat/completions",
                json={"model": SMOL, "max_tokens": 2, "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": f"question {q}"}]},
                timeout=60,
            )
            assert resp.status_code == 200, resp.text
            picks.append(which(ws, before))
        assert len(set(picks)) == 1, picks
        home = picks[0]
        # The engine's own prefix cache shows the reuse: 4 repeats of a 100+ token prefix.
        assert ws[home].prefix_hits() - hits_before[home] >= 4 * 6 * BLOCK, (
            ws[home].prefix_hits(), hits_before[home])


def test_kv_aware_routes_by_the_blocks_each_engine_reported():
    """Each engine is warmed directly (not through the router) with its own long prompt; the
    router learns where the blocks live only from aphro's KV events, and sends a later request
    with that prefix to the engine that stored it."""
    prompts = [[1000 + 7 * i + e for i in range(12 * BLOCK)] for e in range(2)]
    with engines(2) as ws:
        sources = [arg for w in ws for arg in ("--kv-event-source", f"{w.base}={w.events}")]
        with router(ws, "--policy", "kv_aware", *sources,
                    "--kv-event-block-size", str(BLOCK), "--kv-event-model", SMOL) as r:
            time.sleep(1.0)  # the router's SUB sockets connect
            for w, ids in zip(ws, prompts):
                assert complete_ids(w.base, ids).status_code == 200
            time.sleep(1.0)  # events reach the router
            for e in (1, 0, 1, 0):
                before = [w.served() for w in ws]
                hits = ws[e].prefix_hits()
                resp = complete_ids(r, prompts[e] + [5, 6, 7])
                assert resp.status_code == 200, resp.text
                assert which(ws, before) == e
                assert ws[e].prefix_hits() - hits >= 12 * BLOCK - BLOCK


def test_router_fails_over_when_an_engine_dies():
    with engines(2) as ws, router(ws, "--policy", "round_robin",
                                  "--health-check-interval-secs", "1",
                                  "--health-failure-threshold", "1") as r:
        for i in range(4):
            assert chat(r, f"warm {i}").status_code == 200
        ws[0].proc.send_signal(signal.SIGKILL)
        ws[0].proc.wait(timeout=10)
        ok = failed = 0
        deadline = time.time() + 60
        for i in range(12):
            try:
                resp = chat(r, f"after the failure {i}", timeout=30)
            except httpx.TimeoutException:
                pytest.fail("a request hung after an engine died")
            if resp.status_code == 200:
                ok += 1
            else:
                # An error the client can see (never a silent drop): an OpenAI-style body.
                failed += 1
                assert resp.status_code >= 500 and resp.text, resp
            assert time.time() < deadline
        # Once the health check has taken the dead engine out, everything is served.
        assert ok >= 8, (ok, failed)
        time.sleep(2.5)
        before = ws[1].served()
        for i in range(4):
            assert chat(r, f"settled {i}").status_code == 200
        assert ws[1].served() - before == 4


# --- a subscriber written from vLLM's definitions ----------------------------------------

def _recv_batches(sock, want_blocks: int, timeout_s: float = 30.0):
    import zmq

    batches, blocks = [], 0
    deadline = time.time() + timeout_s
    while blocks < want_blocks and time.time() < deadline:
        if sock.poll(200, zmq.POLLIN):
            topic, seq, payload = sock.recv_multipart()
            batch = vllm_kv.msgspec.msgpack.decode(payload, type=vllm_kv.KVEventBatch)
            batches.append((topic, int.from_bytes(seq, "big"), payload, batch))
            blocks += sum(len(e.block_hashes) for e in batch.events
                          if isinstance(e, vllm_kv.BlockStored))
    return batches


def test_msgspec_subscriber_decodes_the_stream_checks_hashes_and_replays():
    import zmq

    ctx = zmq.Context()
    with engines(1, topic="kv@pod-0@smol") as (w,):
        sub = ctx.socket(zmq.SUB)
        sub.connect(w.events)
        sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
        time.sleep(0.5)
        ids = [[2000 + 3 * i + k for i in range(5 * BLOCK + 7)] for k in range(2)]
        for p in ids:
            assert complete_ids(w.base, p).status_code == 200
        batches = _recv_batches(sub, want_blocks=10)
        assert batches, "no KV events arrived"
        seqs = [s for _, s, _, _ in batches]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs
        assert {t for t, _, _, _ in batches} == {b"kv@pod-0@smol"}

        # Every stored block's hash is vLLM's sha256_cbor of its tokens, chained from its
        # parent, with NONE_HASH from PYTHONHASHSEED=0.
        none = vllm_kv.none_hash(vllm_kv.sha256_cbor, "0")
        stored = [e for _, _, _, b in batches for e in b.events
                  if isinstance(e, vllm_kv.BlockStored)]
        chains = 0
        for e in stored:
            assert e.medium == "GPU" and e.group_idx == 0 and e.block_size == BLOCK
            assert e.extra_keys == [None] * len(e.block_hashes)
            parent = e.parent_block_hash
            for i, h in enumerate(e.block_hashes):
                toks = e.token_ids[i * BLOCK:(i + 1) * BLOCK]
                assert h == vllm_kv.hash_block_tokens(vllm_kv.sha256_cbor, none, parent, toks, None)
                parent = h
            chains += parent is not None
        first_blocks = {e.block_hashes[0] for e in stored if e.parent_block_hash is None}
        for p in ids:
            want = vllm_kv.hash_block_tokens(vllm_kv.sha256_cbor, none, None, p[:BLOCK], None)
            assert want in first_blocks

        # POST /reset_prefix_cache (a vLLM development route): the subscriber sees the reset.
        resp = httpx.post(f"{w.base}/reset_prefix_cache", timeout=30)
        assert resp.status_code == 200 and resp.json() == {"success": True}, resp.text
        deadline = time.time() + 10
        cleared = False
        while not cleared and time.time() < deadline:
            if sub.poll(200, zmq.POLLIN):
                topic, seq, payload = sub.recv_multipart()
                batch = vllm_kv.msgspec.msgpack.decode(payload, type=vllm_kv.KVEventBatch)
                assert int.from_bytes(seq, "big") > seqs[-1]
                cleared = any(isinstance(e, vllm_kv.AllBlocksCleared) for e in batch.events)
        assert cleared, "no AllBlocksCleared after the reset"
        bad = httpx.post(f"{w.base}/reset_prefix_cache?reset_running_requests=true", timeout=30)
        assert bad.status_code == 400 and "reset_running_requests" in bad.text

        # Replay from the second batch: exactly the buffered batches from there, then the end
        # marker (seq -1).
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(w.replay)
        start = seqs[1] if len(seqs) > 1 else seqs[0]
        dealer.send_multipart([b"", start.to_bytes(8, "big")])
        replayed = []
        deadline = time.time() + 10
        while time.time() < deadline:
            assert dealer.poll(5000, zmq.POLLIN), "replay did not answer"
            # vLLM 0.33.0's replay frames: ["", topic, seq, payload]; the end marker has an
            # empty topic and payload.
            _, topic, seq, payload = dealer.recv_multipart()
            if seq == (-1).to_bytes(8, "big", signed=True):
                assert topic == b"" and payload == b""
                break
            assert topic == b"kv@pod-0@smol"
            replayed.append((int.from_bytes(seq, "big"), payload))
        live = [(s, p) for _, s, p, _ in batches if s >= start]
        assert replayed[: len(live)] == live
        sub.close(0)
        dealer.close(0)
    ctx.term()


def test_llm_d_style_indexer_binds_and_every_pod_connects_with_its_topic():
    """llm-d's KV-cache indexer binds one SUB socket and subscribes to `kv@`; each vLLM pod
    connects its PUB to it with the topic `kv@<pod>@<model>`, and the indexer tells pods apart
    by that topic. The README's recipe, with two aphro servers as the pods."""
    import zmq

    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    port = sub.bind_to_random_port("tcp://127.0.0.1")
    sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
    endpoint = f"tcp://127.0.0.1:{port}"
    try:
        with engines(1, topic="kv@pod-a@smol", connect_to=endpoint) as (a,), \
                engines(1, topic="kv@pod-b@smol", connect_to=endpoint) as (b,):
            seen: dict[bytes, set[int]] = {}
            # A connecting PUB drops what it sends before the connection is up, so a pod's
            # prompt is resent (a new one each time) until its events arrive.
            deadline = time.time() + 60
            k = 0
            while time.time() < deadline and len(seen) < 2:
                k += 1
                for i, w in enumerate((a, b)):
                    ids = [3000 + 7 * k + 100 * i + j for j in range(2 * BLOCK)]
                    assert complete_ids(w.base, ids).status_code == 200
                while sub.poll(500, zmq.POLLIN):
                    topic, seq, payload = sub.recv_multipart()
                    batch = vllm_kv.msgspec.msgpack.decode(payload, type=vllm_kv.KVEventBatch)
                    stored = [e for e in batch.events if isinstance(e, vllm_kv.BlockStored)]
                    if stored:
                        seen.setdefault(topic, set()).add(int.from_bytes(seq, "big"))
            assert set(seen) == {b"kv@pod-a@smol", b"kv@pod-b@smol"}, seen
    finally:
        sub.close(0)
        ctx.term()
