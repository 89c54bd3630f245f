#!/usr/bin/env bash
# Device run 15 (session 8): the whole synthetic GPU lane again, after err_tuple moved into
# ferrite-testkit (the lane's CPU references run on this host's CPU, with q16).
cd "$(dirname "$0")"; chmod +x ferrite gpu
export FERRITE_HOME=/tmp/fh; mkdir -p $FERRITE_HOME/models /tmp/o15
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > /tmp/o15/device.txt
grep -m1 "model name" /proc/cpuinfo >> /tmp/o15/device.txt
grep -o -m1 -w "avx512_vnni" /proc/cpuinfo >> /tmp/o15/device.txt || echo "no avx512_vnni" >> /tmp/o15/device.txt
(cd ../.. && FERRITE_TEST_CUDA=1 timeout 400 target/gpu-main/gpu --test-threads 1 > /tmp/o15/lane.txt 2>&1; echo "lane rc=$?"; grep -E "FAILED|panicked|test result" /tmp/o15/lane.txt | head -20)
./ferrite synth -o /tmp/o15/s.gguf --preset smollm2-135m > /tmp/o15/synth.txt 2>&1; ./ferrite run -m /tmp/o15/s.gguf --backend cpu --temp 0 --max-tokens 8 "hi" > /tmp/o15/cpu-line.txt 2>&1; tail -1 /tmp/o15/cpu-line.txt
cat /tmp/o15/device.txt
cd /tmp/o15 && rm -f s.gguf && tar czf $OUT/run15.tgz .
