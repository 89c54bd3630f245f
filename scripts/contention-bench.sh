#!/usr/bin/env bash
# Decode at 2 threads with and without another process busy on one core (issue 32,
# "steady under contention"): ferrite and llama.cpp, interleaved, on one model.
#
# usage: scripts/contention-bench.sh MODEL.gguf [ROUNDS]
# Environment: LLAMA_BENCH (llama-bench binary, required), FERRITE (default
# target/release/ferrite), GEN (tokens per ferrite run, default 128; llama.cpp runs 32, as it
# can slow to a few tokens per second under load).
# Prints one line per measurement: round, load (idle|busy), engine, decode tok/s. The busy
# load is a shell loop at the default priority, started before and stopped after each pair.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:?usage: scripts/contention-bench.sh MODEL.gguf [ROUNDS]}
rounds=${2:-3}
ferrite=${FERRITE:-target/release/ferrite}
llama=${LLAMA_BENCH:?set LLAMA_BENCH to a llama-bench binary}
for tool in "$ferrite" "$llama"; do
    [[ -x $tool ]] || { echo "missing: $tool" >&2; exit 2; }
done
grep -m1 'model name' /proc/cpuinfo
echo "cores: $(nproc); ferrite $(git rev-parse --short HEAD); model $(sha256sum "$model" | cut -c1-16)…"

busy=
stop_busy() { [[ -z $busy ]] || kill "$busy" 2> /dev/null || true; busy=; }
trap stop_busy EXIT
for round in $(seq "$rounds"); do
    for load in idle busy; do
        if [[ $load == busy ]]; then
            sh -c 'while :; do :; done' > /dev/null 2>&1 &
            busy=$!
        fi
        f=$("$ferrite" bench -m "$model" --threads 2 --ctx-start 16 --ctx-max 16 \
            --gen-tokens "${GEN:-128}" --runs 3 --warmup 1 2> /dev/null | awk 'NR == 2 {print $6}')
        echo "round $round $load ferrite $f"
        l=$("$llama" -m "$model" -p 0 -n 32 -r 3 -t 2 -o csv 2> /dev/null |
            awk -F, 'NR == 2 {gsub(/"/, ""); print $(NF - 1)}')
        echo "round $round $load llama.cpp $l"
        stop_busy
    done
done
