#!/usr/bin/env bash
# Device run 20 (session 11): the whole synthetic GPU lane after the CPU quantization split and attention output change (5ef866a)
# (the lane's CPU references run on this host's CPU).
cd "$(dirname "$0")"; chmod +x ferrite gpu
export FERRITE_HOME=/tmp/fh; mkdir -p $FERRITE_HOME/models /tmp/o20
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > /tmp/o20/device.txt
grep -m1 "model name" /proc/cpuinfo >> /tmp/o20/device.txt
grep -o -m1 -w "avx512_vnni" /proc/cpuinfo >> /tmp/o20/device.txt || echo "no avx512_vnni" >> /tmp/o20/device.txt
(cd ../.. && FERRITE_TEST_CUDA=1 timeout 400 target/gpu-main/gpu --test-threads 1 > /tmp/o20/lane.txt 2>&1; echo "lane rc=$?"; grep -E "FAILED|panicked|test result" /tmp/o20/lane.txt | head -20)
./ferrite synth -o /tmp/o20/s.gguf --preset smollm2-135m > /tmp/o20/synth.txt 2>&1; ./ferrite run -m /tmp/o20/s.gguf --backend cpu --temp 0 --max-tokens 8 "hi" > /tmp/o20/cpu-line.txt 2>&1; tail -1 /tmp/o20/cpu-line.txt
cat /tmp/o20/device.txt
cd /tmp/o20 && rm -f s.gguf && tar czf $OUT/run20.tgz .
