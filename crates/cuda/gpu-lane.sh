#!/usr/bin/env bash
# The GPU test lane of ferrite-cuda. On the development machine:
#   CARGO_TARGET_DIR=target cargo test --release -p ferrite-cuda --no-run
# prints the path of the `gpu` test binary; send it to the GPU machine and run there:
#   crates/cuda/gpu-lane.sh path/to/gpu-<hash> [--bench]
# The lane fails (not skips) when no CUDA device is found. Real-model comparisons (against
# the CPU backend and the logits fixtures under fixtures/reference or $FERRITE_FIXTURES; run
# it from the repository root) run when $FERRITE_HOME/models holds the model files and print
# `skipped:` otherwise; FERRITE_TEST_MODELS=1 makes a missing model a failure.
set -euo pipefail
bin=${1:?usage: gpu-lane.sh GPU_TEST_BINARY [--bench]}
export FERRITE_TEST_CUDA=1
export FERRITE_HOME=${FERRITE_HOME:-$HOME/.cache/ferrite}
"$bin" --nocapture --test-threads 1
if [[ ${2:-} == --bench ]]; then
    "$bin" --nocapture --ignored decode_speed_smollm2_shape
    "$bin" --nocapture --ignored batch_decode_speed
fi
