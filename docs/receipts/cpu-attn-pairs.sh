#!/usr/bin/env bash
# Base and new ferrite binaries alternating, each run under shared/tools/clean-run: decode
# batches at two depths, a 512-token prefill, and Gemma 3 decode, in process.
#
#   cpu-attn-pairs.sh BASE_BIN NEW_BIN SMOLLM2 GEMMA OUT_DIR PAIRS
set -euo pipefail
base=${1:?base binary}; new=${2:?new binary}; smol=${3:?SmolLM2 gguf}; gemma=${4:?Gemma gguf}
out=${5:?output dir}; pairs=${6:-3}
clean=$(dirname "$0")/../../../shared/tools/clean-run
[[ -x $clean ]] || clean=/work/shared/tools/clean-run
mkdir -p "$out"
run() { # name bin model args...
    local name=$1 bin=$2 model=$3; shift 3
    "$clean" -- "$bin" bench -m "$model" --backend cpu "$@" --csv "$out/$name.csv" | tail -n +1 >/dev/null
}
for i in $(seq 1 "$pairs"); do
    for tag in base new; do
        bin=$base; [[ $tag == new ]] && bin=$new
        run "batch-d16-$tag-$i" "$bin" "$smol" --batch 1,4,16 --ctx 512 --ctx-start 16 --ctx-max 16 --gen-tokens 128 --runs 3
        run "batch-d160-$tag-$i" "$bin" "$smol" --batch 1,16 --ctx 512 --ctx-start 160 --ctx-max 160 --gen-tokens 128 --runs 3
        run "prefill512-$tag-$i" "$bin" "$smol" --batch 1 --ctx 1024 --ctx-start 512 --ctx-max 512 --gen-tokens 64 --runs 3
        run "gemma-d400-$tag-$i" "$bin" "$gemma" --batch 1,16 --ctx 1024 --ctx-start 400 --ctx-max 400 --gen-tokens 64 --runs 3
    done
done
