#!/usr/bin/env bash
# Device run 18 (session 10): the whole synthetic GPU lane after the attention launches moved to attn_ops.rs (8689aea)
# (the lane's CPU references run on this host's CPU).
cd "$(dirname "$0")"; chmod +x ferrite gpu
export FERRITE_HOME=/tmp/fh; mkdir -p $FERRITE_HOME/models /tmp/o18
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > /tmp/o18/device.txt
grep -m1 "model name" /proc/cpuinfo >> /tmp/o18/device.txt
grep -o -m1 -w "avx512_vnni" /proc/cpuinfo >> /tmp/o18/device.txt || echo "no avx512_vnni" >> /tmp/o18/device.txt
(cd ../.. && FERRITE_TEST_CUDA=1 timeout 400 target/gpu-main/gpu --test-threads 1 > /tmp/o18/lane.txt 2>&1; echo "lane rc=$?"; grep -E "FAILED|panicked|test result" /tmp/o18/lane.txt | head -20)
./ferrite synth -o /tmp/o18/s.gguf --preset smollm2-135m > /tmp/o18/synth.txt 2>&1; ./ferrite run -m /tmp/o18/s.gguf --backend cpu --temp 0 --max-tokens 8 "hi" > /tmp/o18/cpu-line.txt 2>&1; tail -1 /tmp/o18/cpu-line.txt
cat /tmp/o18/device.txt
cd /tmp/o18 && rm -f s.gguf && tar czf $OUT/run18.tgz .
