#!/usr/bin/env bash
# The arch fixtures through the binary on the GPU machine: for each named family,
# `score --mode decode` against its transformers logits on the CPU and CUDA backends (both
# f16 KV), and `run` of 24 greedy tokens on both, texts compared. Prints each score line,
# the backend lines and whether the texts match; everything also lands in $OUT.
#
# Run from the repository root with the stripped binary carried as target/gpu/ferrite:
#   bash scripts/gpu-arch-cli.sh deepseek2 deepseek3
# Fixtures: $FERRITE_ARCH_FIXTURES (default fixtures/arch).
set -u
F=${FERRITE:-./target/gpu/ferrite}
ROOT=${FERRITE_ARCH_FIXTURES:-fixtures/arch}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export FERRITE_HOME=${FERRITE_HOME:-/tmp/fh}; mkdir -p "$FERRITE_HOME"
for a in "$@"; do
  dir=$ROOT/$a
  [[ -f $dir/logits-$a.jsonl ]] || { echo "$a: no fixture at $dir"; exit 1; }
  for be in cpu cuda; do
    $F score -m "$dir" --fixture "$dir/logits-$a.jsonl" --mode decode --backend $be \
      > "$OUT/score-$a-$be.txt" 2>&1
    echo "$a score $be rc=$?"
    grep -E 'backend=|top-1|nll|rror' "$OUT/score-$a-$be.txt" | head -6
    $F run -m "$dir" --backend $be --max-tokens 24 --temp 0 -p "The quick brown fox" \
      > "$OUT/run-$a-$be.txt" 2> "$OUT/run-$a-$be.err"
    echo "$a run $be rc=$?"; grep -m1 'backend=' "$OUT/run-$a-$be.err"
  done
  if cmp -s "$OUT/run-$a-cpu.txt" "$OUT/run-$a-cuda.txt"; then
    echo "$a run: cpu and cuda texts identical"
  else
    echo "$a run: cpu and cuda texts DIFFER"
  fi
done
