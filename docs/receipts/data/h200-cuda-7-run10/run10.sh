#!/usr/bin/env bash
# Device run 10 (session 7): Q4_0 and BF16 CUDA weights — full synthetic lane, then
# memcheck on the kernel tests.
cd "$(dirname "$0")"; chmod +x ferrite gpu
export FERRITE_HOME=/tmp/fh FERRITE_CUDA_COUNTS=1; mkdir -p $FERRITE_HOME/models /tmp/o10s
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > /tmp/o10s/device.txt
(cd ../.. && FERRITE_TEST_CUDA=1 timeout 300 target/gpu-main/gpu --test-threads 1 > /tmp/o10s/lane.txt 2>&1; echo "lane rc=$?"; grep -E "FAILED|panicked|test result" /tmp/o10s/lane.txt | head -20)
(cd ../.. && FERRITE_TEST_CUDA=1 timeout 200 compute-sanitizer --tool memcheck target/gpu-main/gpu --test-threads 1 kernels::matvec kernels::embed kernels::fused_gated kernels::prefill_matmul > /tmp/o10s/memcheck.txt 2>&1; echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|test result" /tmp/o10s/memcheck.txt)
cd /tmp/o10s && tar czf $OUT/run10.tgz .
