#!/usr/bin/env bash
# Side-by-side CPU speed of ferrite and llama.cpp at 2 threads (issue 32), both under
# shared/tools/clean-run so that a run overlapping other work is retried or marked.
#
# usage: scripts/avx2-side-by-side.sh [OUT_DIR]
#
# Environment (all optional):
#   LLAMA_BUILD   llama.cpp build dir with bin/llama-bench (default /work/llama-build), built
#                 from the llama-cpp-python sdist's vendored sources:
#                   pip download --no-deps --no-binary llama-cpp-python llama-cpp-python -d SRC
#                   cmake SRC/vendor/llama.cpp -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
#                     -DLLAMA_CURL=OFF && cmake --build . --target llama-bench llama-cli -j2
#   FERRITE       the ferrite binary (default target/release/ferrite)
#   CLEAN_RUN     the clean-run tool (default /work/shared/tools/clean-run)
#   ATTEMPTS      clean-run attempts per command (default 3)
#   MODELS        model names known to `ferrite pull` (default "smollm2-135m-instruct gemma3-270m")
#   FERRITE_SIMD  passed through: set avx2 on an AVX-512 machine to compare with an AVX2
#                 llama.cpp build (-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AVX512=OFF)
#
# Writes OUT_DIR/{cpu.txt, llama-MODEL.txt, ferrite-MODEL-DEPTH.csv, *.clean}: the clean-run
# verdict lines go to the .clean files, so a receipt can say which numbers were clean.
set -euo pipefail

cd "$(dirname "$0")/.."
out=${1:-/tmp/avx2-side-by-side}
llama=${LLAMA_BUILD:-/work/llama-build}/bin/llama-bench
ferrite=${FERRITE:-target/release/ferrite}
clean=${CLEAN_RUN:-/work/shared/tools/clean-run}
attempts=${ATTEMPTS:-3}
models=${MODELS:-"smollm2-135m-instruct gemma3-270m"}

for tool in "$llama" "$ferrite" "$clean"; do
    [[ -x $tool ]] || { echo "missing: $tool" >&2; exit 2; }
done
mkdir -p "$out"

{
    grep -m1 'model name' /proc/cpuinfo
    echo "cores: $(nproc)"
    grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|fma|f16c|avx512f|avx512_vnni|avx_vnni|amx_int8)$' |
        tr '\n' ' '
    echo
    echo "ferrite commit: $(git rev-parse --short HEAD)$(git diff --quiet || echo -dirty)"
    echo "FERRITE_SIMD=${FERRITE_SIMD:-unset}"
} | tee "$out/cpu.txt"

# One clean-run attempt loop; the verdict lines (stderr) go to NAME.clean, the clean
# attempt's output to NAME.
timed() {
    local name=$1
    shift
    "$clean" --attempts "$attempts" --out "$out/$name" -- "$@" 2> >(tee "$out/$name.clean" >&2) ||
        echo "no clean attempt: $name (numbers in $out/$name are from a contaminated run)" |
        tee -a "$out/$name.clean"
}

for name in $models; do
    path=$("$ferrite" pull "$name" | tail -n 1)
    echo "== $name: $path (sha256 $(sha256sum "$path" | cut -c1-16)…)"
    timed "llama-$name.txt" "$llama" -m "$path" -p 512 -n 128 -d 0,512 -r 3 -t 2
    for depth in 16 512; do
        timed "ferrite-$name-$depth.csv" "$ferrite" bench -m "$path" --threads 2 \
            --ctx-start "$depth" --ctx-max "$depth" --gen-tokens 128 --runs 3 --warmup 1
    done
done
echo "receipts in $out"
