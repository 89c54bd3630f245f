#!/usr/bin/env bash
# Second device run of the gpubatch helper: batched decode speed in process (SmolLM2 and
# 8B shapes), and ferrite serve --backend cuda on the 8B shape (smoke + bench serve).
cd "$(dirname "$0")"; chmod +x ferrite gpu
export FERRITE_HOME=/tmp/fh; mkdir -p $FERRITE_HOME /tmp/s8
(time ./ferrite synth --preset llama-8b --type q4_k_m --seed 1 -o /tmp/s8/s.gguf) 2>&1 | tail -4
FERRITE_TEST_CUDA=1 timeout 120 ./gpu --nocapture --ignored batch_decode_speed 2>&1 | grep -E "model:|n=|result|panicked" | tee $OUT/speed-smollm2.txt
FERRITE_TEST_CUDA=1 FERRITE_BATCH_BENCH_MODEL=/tmp/s8/s.gguf timeout 200 ./gpu --nocapture --ignored batch_decode_speed 2>&1 | grep -E "model:|n=|result|panicked" | tee $OUT/speed-8b.txt
timeout 180 python3 smoke.py ./ferrite /tmp/s8/s.gguf cuda $OUT bench 2>&1 | grep -v "server: req" | tee $OUT/smoke-8b.txt | tail -14
