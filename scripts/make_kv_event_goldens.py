#!/usr/bin/env python3
"""Golden KV-cache events and block hashes as vLLM 0.33.0 makes them.

The struct definitions and hash rules below are copied from the vLLM 0.33.0 wheel
(PyPI `vllm==0.33.0`): `vllm/distributed/kv_events.py` (EventBatch, KVCacheEvent,
BlockStored, BlockRemoved, AllBlocksCleared), `vllm/utils/hashing.py` (sha256,
sha256_cbor), and `vllm/v1/core/kv_cache_utils.py` (NONE_HASH seeding, tagged extra keys
in `generate_block_hash_extra_keys`, untagged event keys in `to_event_extra_keys`,
`hash_block_tokens`, `maybe_convert_block_hash`, `_gen_mm_extra_hash_keys`; the copy
of the last was checked against the installed vLLM 0.33.0 on 300 random layouts). Payloads are encoded with
`msgspec.msgpack.Encoder().encode(batch)`, as `ZmqEventPublisher` does.

    pip install msgspec==0.23.0 cbor2
    python3 scripts/make_kv_event_goldens.py > testdata/kv_events/vllm_0.33.0.json
"""
import hashlib
import json
import pickle
from typing import Any

import cbor2
import msgspec


# --- vllm/distributed/kv_events.py @ 0.33.0 ----------------------------------
class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base class for all KV cache-related events."""


class BlockStored(KVCacheEvent):
    block_hashes: list[bytes | int]
    parent_block_hash: bytes | int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: list[list[int]] | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[bytes | int]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


# --- vllm/utils/hashing.py and vllm/v1/core/kv_cache_utils.py @ 0.33.0 ---------
def sha256(x: Any) -> bytes:
    return hashlib.sha256(pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def sha256_cbor(x: Any) -> bytes:
    return hashlib.sha256(cbor2.dumps(x, canonical=True)).digest()


HASH_FNS = {"sha256": sha256, "sha256_cbor": sha256_cbor}
DEFAULT_NONE_HASH_SEED = "vllm-none-hash"  # PYTHONHASHSEED unset, cryptographic hash


def none_hash(fn, python_hash_seed):
    return fn(python_hash_seed if python_hash_seed is not None else DEFAULT_NONE_HASH_SEED)


def hash_block_tokens(fn, none, parent, tokens, extra_keys):
    return fn((parent or none, tuple(tokens), extra_keys))


def to_event_extra_keys(extra_keys):
    if not extra_keys:
        return None
    return [
        None if keys is None else tuple(k[1:] if k[0] == "mm" else k[1] for k in keys)
        for keys in extra_keys
    ] or None


def gen_mm_extra_hash_keys(mm_features, start_token_idx, end_token_idx, start_mm_idx):
    """`_gen_mm_extra_hash_keys` @ 0.33.0; `mm_features` = [(identifier, offset, length)]
    sorted by offset."""
    extra_keys = []
    if not mm_features:
        return extra_keys, start_mm_idx
    last_offset, last_length = mm_features[-1][1], mm_features[-1][2]
    if last_offset + last_length <= start_token_idx:
        return extra_keys, start_mm_idx
    curr_mm_idx = start_mm_idx
    while mm_features and curr_mm_idx < len(mm_features):
        identifier, offset, length = mm_features[curr_mm_idx]
        if end_token_idx > offset:
            if start_token_idx >= offset + length:
                curr_mm_idx += 1
                continue
            extra_keys.append(("mm", identifier, offset - start_token_idx))
            if end_token_idx >= offset + length:
                curr_mm_idx += 1
            else:
                break
        else:
            break
    return extra_keys, curr_mm_idx


def block_extra_keys(i, lora, salt, mm=None, mm_idx=0):
    """`generate_block_hash_extra_keys`: LoRA, the multimodal items in the block, then the
    salt on block 0. Returns the keys and the next multimodal index."""
    keys = []
    if lora is not None:
        keys.append(("lora", lora[0], lora[1]))
    mm_keys, mm_idx = gen_mm_extra_hash_keys(
        [tuple(m) for m in mm or []], i * BLOCK, (i + 1) * BLOCK, mm_idx
    )
    keys += mm_keys
    if salt is not None and i == 0:
        keys.append(("cache_salt", salt))
    return (tuple(keys) if keys else None), mm_idx


def external(h, int_hashes):
    return int.from_bytes(h, "big") & ((1 << 64) - 1) if int_hashes else h


BLOCK = 16
CASES = [
    {"name": "plain", "algo": "sha256", "seed": None, "blocks": 2},
    {"name": "plain_cbor", "algo": "sha256_cbor", "seed": None, "blocks": 2},
    {"name": "seed0_cbor", "algo": "sha256_cbor", "seed": "0", "blocks": 3},
    {"name": "seed0_pickle", "algo": "sha256", "seed": "0", "blocks": 1},
    {"name": "salted", "algo": "sha256_cbor", "seed": "0", "blocks": 2, "salt": "tenant-a"},
    {"name": "lora", "algo": "sha256", "seed": None, "blocks": 2, "lora": ["my-lora", "/adapters/my-lora"], "salt": "s"},
    # Two images: the first spans blocks 0-1 (negative offset in block 1), the second ends
    # exactly at the end of block 2; block 3 has none. Image ids are mm_hash-like hex.
    {"name": "mm", "algo": "sha256", "seed": None, "blocks": 4, "salt": "s",
     "mm": [["95f7d20ea69d5280e3d305f90033cb22bad47584da5733854b1bff9514a7969d", 5, 20],
            ["sku-1234", 40, 8]]},
    {"name": "mm_cbor_lora", "algo": "sha256_cbor", "seed": "0", "blocks": 2,
     "lora": ["my-lora", "/adapters/my-lora"], "mm": [["img-a", 16, 16]]},
]


def main():
    out = []
    encoder = msgspec.msgpack.Encoder()
    for c in CASES:
        fn = HASH_FNS[c["algo"]]
        none = none_hash(fn, c["seed"])
        tokens = [(7 * j + 3) % 49152 for j in range(c["blocks"] * BLOCK)]
        hashes, extras, parent, mm_idx = [], [], None, 0
        for i in range(c["blocks"]):
            extra, mm_idx = block_extra_keys(i, c.get("lora"), c.get("salt"), c.get("mm"), mm_idx)
            h = hash_block_tokens(fn, none, parent, tokens[i * BLOCK:(i + 1) * BLOCK], extra)
            hashes.append(h)
            extras.append(extra)
            parent = h
        lora = c.get("lora")
        payloads = {}
        for int_hashes in (True, False):
            # Blocks 1.. stored after block 0 was (a parent), then block 0 evicted, then a reset.
            batch = KVEventBatch(
                ts=1764950400.5,
                events=[
                    BlockStored(
                        block_hashes=[external(h, int_hashes) for h in hashes[1:] or hashes],
                        parent_block_hash=external(hashes[0], int_hashes) if len(hashes) > 1 else None,
                        token_ids=tokens[BLOCK:] if len(hashes) > 1 else tokens,
                        block_size=BLOCK,
                        lora_id=None,
                        medium="GPU",
                        lora_name=lora[0] if lora else None,
                        extra_keys=to_event_extra_keys(extras[1:] or extras),
                        group_idx=0,
                    ),
                    BlockRemoved(block_hashes=[external(hashes[0], int_hashes)], medium="GPU", group_idx=0),
                    AllBlocksCleared(),
                ],
                data_parallel_rank=None if int_hashes else 1,
            )
            payloads["int" if int_hashes else "bytes"] = encoder.encode(batch).hex()
        out.append({**c, "block_size": BLOCK, "tokens": tokens, "none_hash": none.hex(),
                    "block_hashes": [h.hex() for h in hashes], "payload": payloads})
    print(json.dumps({"vllm": "0.33.0", "msgspec": msgspec.__version__, "cases": out}, indent=1))


if __name__ == "__main__":
    main()
