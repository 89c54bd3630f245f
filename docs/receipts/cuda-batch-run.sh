#!/usr/bin/env bash
# One device run of the gpubatch helper: full GPU lane (batch tests included), planted
# defect, memcheck of the batched llama test, serve smoke on CUDA (+ bench serve), on CPU.
cd "$(dirname "$0")"; chmod +x ferrite gpu gpu-defect
export FERRITE_HOME=/tmp/fh; mkdir -p $FERRITE_HOME
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; date -u; } > $OUT/lane-all.txt
FERRITE_TEST_CUDA=1 timeout 220 ./gpu --nocapture --test-threads 1 >> $OUT/lane-all.txt 2>&1; echo "lane rc=$?" >> $OUT/lane-all.txt
grep -E "^batch |test result|FAILED|panicked" $OUT/lane-all.txt | head -60
{ echo "== planted defect (bmv_gated stores column ncol-1-c)"; FERRITE_TEST_CUDA=1 timeout 60 ./gpu-defect --test-threads 1 batched_steps_match_single_steps_llama 2>&1 | tail -12; echo "defect rc=${PIPESTATUS[0]}";
  echo "== memcheck"; FERRITE_TEST_CUDA=1 timeout 90 compute-sanitizer --tool memcheck ./gpu --test-threads 1 batched_steps_match_single_steps_llama 2>&1 | tail -8; } > $OUT/checks.txt 2>&1
cat $OUT/checks.txt
./ferrite synth --preset smollm2-135m --type q4_1 --seed 1 -o /tmp/s.gguf 2>&1 | tail -1
sha256sum /tmp/s.gguf
timeout 150 python3 smoke.py ./ferrite /tmp/s.gguf cuda $OUT bench 2>&1 | grep -v "server: req" > $OUT/smoke-cuda.txt; echo "smoke cuda rc=$?"
tail -30 $OUT/smoke-cuda.txt
timeout 60 python3 smoke.py ./ferrite /tmp/s.gguf cpu $OUT 2>&1 | grep -v "server: req" | tail -6
