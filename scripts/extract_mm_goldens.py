#!/usr/bin/env python3
"""Cut vLLM's multimodal render goldens (shared/fixtures/multimodal) down to what the parity
tests compare: token ids, features (blobs replaced by their base64 length + sha256) and the
decoded tensor checksums. Usage: extract_mm_goldens.py <fixtures/multimodal> <testdata/multimodal>"""
import json, shutil, sys, os

SKIP_IMAGES = {"photo_3000x2000.jpg"}  # 300 KB and a 7597-token resize: too slow for a dev-profile test


def blob(b64, decoded):
    if isinstance(b64, dict):  # elided by the generator
        return {"b64_len": b64["b64_len"], "b64_sha256": b64["b64_sha256"]}
    return {"b64_len": decoded["b64_len"], "b64_sha256": decoded["b64_sha256"]}


def tensors(decoded):
    return {k: {"dtype": v["data"]["dtype"], "shape": v["data"]["shape"], "sha256": v["data"]["sha256"]}
            for k, v in decoded["fields"].items()}


def compact(rec):
    out = {k: rec[k] for k in ("id", "model", "endpoint", "server_flags", "status", "request", "note")}
    resp = rec["response"]
    if rec["status"] != 200:
        out["response"] = resp
        return out
    items = resp if isinstance(resp, list) else [resp]
    new_items = []
    for it in items:
        it = dict(it)
        it.pop("token_ids_compact", None)
        feats = it.get("features")
        if feats:
            feats = dict(feats)
            dec = rec.get("decoded") or {}
            for key in ("kwargs_data", "mm_metadata"):
                if feats.get(key):
                    feats[key] = {m: [dict(blob(b, d), tensors=tensors(d))
                                      for b, d in zip(bs, dec[key][m])]
                                  for m, bs in feats[key].items()}
            it["features"] = feats
        new_items.append(it)
    out["response"] = new_items if isinstance(resp, list) else new_items[0]
    return out


def main(src, dst):
    os.makedirs(os.path.join(dst, "images"), exist_ok=True)
    keep = []
    for name in ("qwen2_vl.jsonl", "qwen3_vl.jsonl"):
        for line in open(os.path.join(src, name)):
            rec = json.loads(line)
            if any(f"images/{s}" in json.dumps(rec["request"]) for s in SKIP_IMAGES):
                continue
            keep.append(compact(rec))
    with open(os.path.join(dst, "render_cases.jsonl"), "w") as f:
        for r in keep:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")
    shutil.copy(os.path.join(src, "generate_validation.jsonl"), dst)
    for img in os.listdir(os.path.join(src, "images")):
        if img not in SKIP_IMAGES:
            shutil.copy(os.path.join(src, "images", img), os.path.join(dst, "images", img))
    for model in os.listdir(os.path.join(src, "models")):
        shutil.copytree(os.path.join(src, "models", model), os.path.join(dst, "models", model), dirs_exist_ok=True)
    print(len(keep), "cases")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
