#!/usr/bin/env bash
# ferrite serve and llama-server side by side under the same client (`ferrite bench serve`),
# one engine at a time on the same machine, same model, same slot count and per-slot context.
# Run it under shared/tools/clean-run so the timings are only kept from an idle machine.
#
#   serve-side-by-side.sh FERRITE_BIN LLAMA_SERVER_BIN MODEL OUT_DIR [CONCURRENCY]
#
# Writes OUT_DIR/ferrite.csv and OUT_DIR/llama-server.csv (bench serve's receipt rows).
set -euo pipefail
ferrite=${1:?ferrite binary}
llama=${2:?llama-server binary}
model=${3:?model file}
out=${4:?output directory}
conc=${5:-1,4,16}
slots=16
ctx_per_slot=512
mkdir -p "$out"

wait_healthy() {
    for _ in $(seq 1 120); do
        if [[ $(curl -s -o /dev/null -w '%{http_code}' "$1/health") == 200 ]]; then
            return 0
        fi
        sleep 0.5
    done
    echo "server at $1 never became healthy" >&2
    return 1
}

bench() {
    "$ferrite" bench serve --url "$1" --concurrency "$conc" --prompt-tokens 128 \
        --max-tokens 64 --rounds 2 --csv "$out/$2.csv"
}

# ferrite: --ctx is per slot; the prefix cache is off so neither engine reuses prompts
# (each request starts with its own tag anyway).
"$ferrite" serve -m "$model" --port 8091 --parallel "$slots" --threads 2 \
    --ctx "$ctx_per_slot" --kv-mem-space-mb 0 >"$out/ferrite-server.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
wait_healthy http://127.0.0.1:8091
bench http://127.0.0.1:8091 ferrite
kill "$pid"
wait "$pid" 2>/dev/null || true

# llama-server: -c is the total context, divided among the -np slots.
"$llama" -m "$model" -t 2 -c $((slots * ctx_per_slot)) -np "$slots" --port 8092 \
    >"$out/llama-server.log" 2>&1 &
pid=$!
wait_healthy http://127.0.0.1:8092
bench http://127.0.0.1:8092 llama-server
kill "$pid"
wait "$pid" 2>/dev/null || true
