#!/usr/bin/env bash
# Device run 13 (session 8): the whole synthetic GPU lane with the CPU's q16 products
# (the lane's CPU references run on this host's CPU).
cd "$(dirname "$0")"; chmod +x ferrite gpu
export FERRITE_HOME=/tmp/fh; mkdir -p $FERRITE_HOME/models /tmp/o13
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > /tmp/o13/device.txt
grep -m1 "model name" /proc/cpuinfo >> /tmp/o13/device.txt
grep -o -m1 -w "avx512_vnni" /proc/cpuinfo >> /tmp/o13/device.txt || echo "no avx512_vnni" >> /tmp/o13/device.txt
(cd ../.. && FERRITE_TEST_CUDA=1 timeout 400 target/gpu-main/gpu --test-threads 1 > /tmp/o13/lane.txt 2>&1; echo "lane rc=$?"; grep -E "FAILED|panicked|test result" /tmp/o13/lane.txt | head -20)
./ferrite synth -o /tmp/o13/s.gguf --preset smollm2-135m > /tmp/o13/synth.txt 2>&1; ./ferrite run -m /tmp/o13/s.gguf --backend cpu --temp 0 --max-tokens 8 "hi" > /tmp/o13/cpu-line.txt 2>&1; tail -1 /tmp/o13/cpu-line.txt
cat /tmp/o13/device.txt
cd /tmp/o13 && rm -f s.gguf && tar czf $OUT/run13.tgz .
