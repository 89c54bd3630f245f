#!/usr/bin/env bash
# The grammar mask's cost per token on Gemma 3's 262k vocabulary, with the mask computed
# during the forward pass (issue 33's receipt, docs/receipts/grammar-mask-cost-2026-12-07.md).
# Two measurements, each repeated RUNS times (default 3) through ../shared/tools/clean-run,
# which says whether anything else used the CPU meanwhile; `uptime` is logged before each:
#   1. the engine bench crates/engine/tests/mask_cost.rs (`overlapped_...`): per decode step,
#      the forward pass and the pick, free and held to four constraints;
#   2. `ferrite run` on Gemma, greedy, 64 tokens, free and held to a JSON schema the answer
#      cannot finish within 64 tokens (so both decode the same number): its decode tok/s.
#
# usage: scripts/grammar-mask-cost.sh OUT_DIR FERRITE_BINARY MASK_COST_TEST_BINARY
# The test binary is target/release/deps/mask_cost-* (cargo test --release -p ferrite-engine
# --test mask_cost --no-run). ATTEMPTS (default 2) and IDLE_PCT (default 4) pass through to
# clean-run; IDLE_PCT=101 starts at once on a machine that is never idle (runs still labelled).
set -euo pipefail
out=$1
bin=$2
bench=$3
clean_run=${CLEAN_RUN:-/work/shared/tools/clean-run}
model=${FERRITE_HOME:-$HOME/.cache/ferrite}/models/gemma-3-270m-q4_k_m.gguf
runs=${RUNS:-3}
cr() { "$clean_run" --attempts "${ATTEMPTS:-2}" --idle-pct "${IDLE_PCT:-4}" -- "$@"; }
mkdir -p "$out"
for i in $(seq 1 "$runs"); do
  uptime | tee -a "$out/bench.log"
  cr "$bench" --ignored --nocapture --test-threads 1 overlapped_mask_cost 2>&1 \
    | grep -E "clean-run|run [0-9]|vocabulary" | tee -a "$out/bench.log" || true
done
schema='{"type": "string", "minLength": 4000}'
prompt="Once upon a time, in a kingdom by the sea,"
for i in $(seq 1 "$runs"); do
  for mode in free held; do
    args=(run -m "$model" --threads 2 --temp 0 --max-tokens 64 -p "$prompt")
    [ "$mode" = held ] && args+=(--json-schema "$schema")
    uptime | sed "s|^|$mode: |" | tee -a "$out/run.log"
    cr "$bin" "${args[@]}" 2>&1 >/dev/null | grep -E "clean-run|decode" \
      | sed "s|^|$mode: |" | tee -a "$out/run.log" || true
  done
done
