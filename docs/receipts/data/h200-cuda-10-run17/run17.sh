#!/usr/bin/env bash
# Device run 17 (session 10): the whole synthetic GPU lane after packed q16 rows, page release and pool rope/stores
# (the lane's CPU references run on this host's CPU).
cd "$(dirname "$0")"; chmod +x ferrite gpu
export FERRITE_HOME=/tmp/fh; mkdir -p $FERRITE_HOME/models /tmp/o17
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > /tmp/o17/device.txt
grep -m1 "model name" /proc/cpuinfo >> /tmp/o17/device.txt
grep -o -m1 -w "avx512_vnni" /proc/cpuinfo >> /tmp/o17/device.txt || echo "no avx512_vnni" >> /tmp/o17/device.txt
(cd ../.. && FERRITE_TEST_CUDA=1 timeout 400 target/gpu-main/gpu --test-threads 1 > /tmp/o17/lane.txt 2>&1; echo "lane rc=$?"; grep -E "FAILED|panicked|test result" /tmp/o17/lane.txt | head -20)
./ferrite synth -o /tmp/o17/s.gguf --preset smollm2-135m > /tmp/o17/synth.txt 2>&1; ./ferrite run -m /tmp/o17/s.gguf --backend cpu --temp 0 --max-tokens 8 "hi" > /tmp/o17/cpu-line.txt 2>&1; tail -1 /tmp/o17/cpu-line.txt
cat /tmp/o17/device.txt
cd /tmp/o17 && rm -f s.gguf && tar czf $OUT/run17.tgz .
