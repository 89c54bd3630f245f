#!/usr/bin/env bash
# Decode and prefill receipts of the two real models at 2 threads on the AVX2 kernels, for
# one or more ferrite binaries side by side (issue 32's receipt). Every run goes through
# ../shared/tools/clean-run, which says whether anything else used the CPU meanwhile.
# (ferrite against ferrite, e.g. main against a branch; scripts/avx2-side-by-side.sh puts
# llama.cpp beside one ferrite binary.)
#
# usage: scripts/avx2-bench.sh OUT_DIR FERRITE_BINARY...
# Writes OUT_DIR/<binary-name>-<model>.csv (ferrite bench receipts: frontiers 16 and 512,
# 64 decoded tokens each, median of 3 runs after 1 warmup) and prints clean-run's lines.
# ATTEMPTS (default 2) and IDLE_PCT (default 4, clean-run's own) pass through to clean-run;
# IDLE_PCT=101 starts at once on a machine that is never idle (the runs are then labelled).
set -euo pipefail
out=$1
shift
clean_run=${CLEAN_RUN:-/work/shared/tools/clean-run}
models=${FERRITE_HOME:-$HOME/.cache/ferrite}/models
mkdir -p "$out"
for bin in "$@"; do
  for model in SmolLM2-135M-Instruct.Q4_1 gemma-3-270m-q4_k_m; do
    name=$(basename "$bin")-$model
    FERRITE_SIMD=avx2 "$clean_run" --attempts "${ATTEMPTS:-2}" --idle-pct "${IDLE_PCT:-4}" -- "$bin" bench \
      -m "$models/$model.gguf" --threads 2 --ctx-start 16 --ctx-max 512 --step-mul 32 \
      --gen-tokens 64 --runs 3 --warmup 1 --teacher-forced --csv "$out/$name.csv" \
      2>&1 | grep -E "clean-run|^ +[0-9]+ " | sed "s|^|$name: |" || true
    # clean-run exits 3 when no attempt was clean; its CONTAMINATED line above says so, and
    # the other runs still go ahead.
  done
done
