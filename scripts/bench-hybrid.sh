#!/usr/bin/env bash
# Decode speed against context of a synthetic Qwen3-Next hybrid beside a dense llama of the
# same width, depth and heads (issue 38's receipt): the hybrid keeps K/V in one layer of
# four, so its decode cost should grow a quarter as fast with context as the llama's, and
# its recurrent state is a fixed size per session.
#
# usage: scripts/bench-hybrid.sh OUT_DIR [BENCH_ARGS...]   (run from the repo root, after
# `cargo build --release`; each run goes through shared/tools/clean-run when it exists)
set -euo pipefail
out=${1:?usage: scripts/bench-hybrid.sh OUT_DIR [BENCH_ARGS...]}
shift
mkdir -p "$out"
bin=target/release/ferrite
shape=(--hidden 512 --layers 8 --heads 8 --kv-heads 4 --ffn 512 --vocab 4096 --type q8_0)
"$bin" synth --arch qwen3next "${shape[@]}" -o "$out/hybrid.gguf"
"$bin" synth --arch qwen3 "${shape[@]}" -o "$out/dense.gguf"
clean=()
if [ -x ../shared/tools/clean-run ]; then clean=(../shared/tools/clean-run --); fi
for m in hybrid dense; do
  "${clean[@]}" "$bin" bench -m "$out/$m.gguf" --backend cpu --ctx-start 256 --ctx-max 4096 \
    --gen-tokens 32 --teacher-forced --runs 3 --csv "$out/$m.csv" "$@"
done
