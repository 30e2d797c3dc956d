#!/usr/bin/env python3
"""Harmony render goldens from vllm-rs: the gpt-oss chat requests of a compare_render.py report.

vLLM renders gpt-oss chats as Harmony (openai-harmony), not with the model's Jinja template.
This keeps, for every chat render request of the `fixture:gpt_oss` run, the request and what
vllm-rs (the Rust render server of the vllm 0.33.0 wheel) answered: its status and, for a 200,
the prompt token ids. `aphro-core/tests/harmony_parity.rs` renders the same requests.

    APHRO_VLLM_RS=.../vllm-rs python3 scripts/compare_render.py --aphro target/debug/aphro \\
        fixture:gpt_oss,tool=openai,reasoning=openai_gptoss,vllm_tool=auto,vllm_reasoning=auto \\
        --json-report /tmp/gpt_oss.json
    python3 scripts/make_harmony_goldens.py /tmp/gpt_oss.json > testdata/render_harmony/gpt_oss_vllm_rs.jsonl

compare_render.py pins VLLM_SYSTEM_START_DATE (its HARMONY_START_DATE) for both servers; the
date is recorded in every case. Only the Python 3 standard library is used.
"""
import json
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from compare_render import HARMONY_START_DATE  # noqa: E402

CHAT_PATHS = {"/v1/chat/completions/render"}


def main():
    report = json.load(open(sys.argv[1], encoding="utf-8"))
    runs = [r for r in report if r["spec"].startswith("fixture:gpt_oss")]
    if len(runs) != 1:
        sys.exit(f"expected one fixture:gpt_oss run in the report, found {len(runs)}")
    n = 0
    for row in runs[0]["rows"]:
        if row.get("path") not in CHAT_PATHS or row["request"] is None:
            continue
        try:
            json.loads(row["request"])
        except json.JSONDecodeError:
            continue  # malformed-JSON cases test the HTTP layer, not rendering
        status = row["status"][1]
        # The body as sent, as text: a lone surrogate escape is valid to Python's JSON parser
        # but not to serde_json, which must see it the way the server does.
        case = {"name": row["name"], "start_date": HARMONY_START_DATE, "body": row["request"],
                "status": status}
        if status == 200:
            body = json.loads(row["vllm_rs"])
            case["token_ids"] = body["token_ids"]
        print(json.dumps(case))
        n += 1
    print(f"{n} cases", file=sys.stderr)


if __name__ == "__main__":
    main()
