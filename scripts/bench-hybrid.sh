#!/usr/bin/env bash
# Decode speed against context of synthetic hybrids (Qwen3-Next's gated DeltaNet, Nemotron-H's
# Mamba-2) beside a dense qwen3 of the same width, depth and heads (issue 38's receipt): a
# hybrid keeps K/V in few layers (one of four, one of eight), so its decode cost should grow
# far slower with context than the dense model's, and its recurrent state is a fixed size
# per session.
#
# usage: scripts/bench-hybrid.sh OUT_DIR [BENCH_ARGS...]   (run from the repo root, after
# `cargo build --release`; each run goes through shared/tools/clean-run when it exists).
# With LLAMA_BENCH=path/to/llama-bench (and TOKENIZER=a real model, e.g. SmolLM2's GGUF, whose
# tokenizer llama.cpp reads), llama.cpp decodes the same Nemotron-H file at the same depths (it reads llama.cpp's nemotron_h layout, which ferrite writes; ferrite's qwen3next
# layout is not llama.cpp's).
set -euo pipefail
out=${1:?usage: scripts/bench-hybrid.sh OUT_DIR [BENCH_ARGS...]}
shift
mkdir -p "$out"
bin=target/release/ferrite
shape=(--hidden 512 --layers 8 --heads 8 --kv-heads 4 --ffn 512 --type q8_0)
# llama.cpp does not read synth's made-up tokenizer: TOKENIZER=MODEL copies a real one.
if [ -n "${TOKENIZER:-}" ]; then shape+=(--tokenizer-from "$TOKENIZER"); else shape+=(--vocab 4096); fi
for arch in qwen3next nemotron_h qwen3; do
  "$bin" synth --arch "$arch" "${shape[@]}" -o "$out/$arch.gguf"
done
clean=()
if [ -x ../shared/tools/clean-run ]; then clean=(../shared/tools/clean-run --); fi
threads=$(nproc)
for arch in qwen3next nemotron_h qwen3; do
  "${clean[@]}" "$bin" bench -m "$out/$arch.gguf" --backend cpu --threads "$threads" \
    --ctx-start 256 --ctx-max 4096 --gen-tokens 32 --teacher-forced --runs 3 \
    --csv "$out/$arch.csv" "$@"
done
if [ -n "${LLAMA_BENCH:-}" ]; then
  "${clean[@]}" "$LLAMA_BENCH" -m "$out/nemotron_h.gguf" -t "$threads" -p 0 -n 32 -r 3 \
    -d 256,512,1024,2048,4096 -o csv >"$out/llama-nemotron_h.csv"
fi
