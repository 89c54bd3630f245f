#!/usr/bin/env bash
# Speculation receipts on an idle CPU machine (issue 39's acceptance lines), every timed
# command through ../shared/tools/clean-run, which says whether anything else used the CPU:
#   1. `ferrite bench --lookup` on SmolLM2 and Gemma 3 (repeat workload, greedy, outputs
#      checked identical by the bench itself): plain and lookup decode tok/s, acceptance;
#   2. `ferrite serve` plain, then with `--lookup`, each loaded RUNS times by
#      `ferrite bench serve --concurrency 16` (aggregate tok/s), with /metrics after. The
#      server is a process of its own, whose CPU clean-run would count as other work: so
#      clean-run watches an idle `sleep 3` before each server starts, and the load runs
#      bare, with `uptime` logged before each.
#
# usage: scripts/speculation-quiet.sh OUT_DIR FERRITE_BINARY
# RUNS (default 3), GEN (default 256), ATTEMPTS (default 2) and IDLE_PCT (default 4) may be
# set; the models are read from $FERRITE_HOME/models (default ~/.cache/ferrite/models).
set -euo pipefail
out=$1
bin=$2
clean_run=${CLEAN_RUN:-/work/shared/tools/clean-run}
models=${FERRITE_HOME:-$HOME/.cache/ferrite}/models
runs=${RUNS:-3}
cr() { "$clean_run" --attempts "${ATTEMPTS:-2}" --idle-pct "${IDLE_PCT:-4}" -- "$@"; }
mkdir -p "$out"
{
  grep -m1 'model name' /proc/cpuinfo
  grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|avx512f|fma|f16c|amx_tile)$' | tr '\n' ' '
  echo
  nproc
  sha256sum "$bin" "$models/SmolLM2-135M-Instruct.Q4_1.gguf" "$models/gemma-3-270m-q4_k_m.gguf"
} | tee "$out/machine.txt"

for m in SmolLM2-135M-Instruct.Q4_1.gguf gemma-3-270m-q4_k_m.gguf; do
  uptime | tee -a "$out/lookup.log"
  cr "$bin" bench -m "$models/$m" --lookup --gen-tokens "${GEN:-256}" --runs 5 --warmup 1 \
    2>&1 | tee -a "$out/lookup.log"
done

port=18733
for mode in plain lookup; do
  cr sleep 3 2>&1 | tee -a "$out/serve.log"
  flags=()
  [[ $mode == lookup ]] && flags=(--lookup)
  "$bin" serve -m "$models/SmolLM2-135M-Instruct.Q4_1.gguf" --port $port --ctx 512 \
    --parallel 16 "${flags[@]}" > "$out/serve-$mode.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 240); do
    curl -sf "http://127.0.0.1:$port/health" > /dev/null && break
    sleep 0.5
  done
  for i in $(seq 1 "$runs"); do
    echo "== $mode run $i: $(uptime)" | tee -a "$out/serve.log"
    "$bin" bench serve --url "http://127.0.0.1:$port" --concurrency 16 --rounds 1 \
      --max-tokens 64 2>&1 | tee -a "$out/serve.log"
  done
  curl -s "http://127.0.0.1:$port/metrics" | grep -E '^ferrite_spec' | tee -a "$out/serve.log" || true
  kill $pid
  wait $pid 2> /dev/null || true
done
