#!/usr/bin/env bash
# Device run 19 (session 10): the whole GPU lane with both real models required
# (FERRITE_TEST_MODELS=1), the host CPU's references on q16 (packed rows; binaries of 8689aea).
cd "$(dirname "$0")"; chmod +x ferrite gpu
export FERRITE_HOME=/tmp/fh; mkdir -p $FERRITE_HOME /tmp/o19
true
cat /tmp/parts/p* | tar xzf - -C $FERRITE_HOME
sha256sum $FERRITE_HOME/models/*.gguf | tee /tmp/o19/models.txt
grep -q b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 /tmp/o19/models.txt || { echo "smollm2 hash mismatch"; exit 2; }
grep -q a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 /tmp/o19/models.txt || { echo "gemma3 hash mismatch"; exit 2; }
(cd ../.. && FERRITE_TEST_CUDA=1 FERRITE_TEST_MODELS=1 timeout 500 target/gpu-main/gpu --test-threads 1 > /tmp/o19/lane.txt 2>&1; echo "lane rc=$?"; grep -E "FAILED|panicked|test result" /tmp/o19/lane.txt | head -20)
./ferrite run -m $FERRITE_HOME/models/SmolLM2-135M-Instruct.Q4_1.gguf --backend cpu --temp 0 --max-tokens 48 "Why is the sky blue?" > /tmp/o19/cpu.txt 2> /tmp/o19/cpu.err
./ferrite run -m $FERRITE_HOME/models/SmolLM2-135M-Instruct.Q4_1.gguf --backend cuda --temp 0 --max-tokens 48 "Why is the sky blue?" > /tmp/o19/cuda.txt 2> /tmp/o19/cuda.err
head -c 400 /tmp/o19/cpu.txt; echo; head -c 400 /tmp/o19/cuda.txt; echo
[ -s /tmp/o19/cpu.txt ] && cmp /tmp/o19/cpu.txt /tmp/o19/cuda.txt && echo "greedy text identical" || echo "greedy text differs or empty"
tail -1 /tmp/o19/cpu.err; tail -1 /tmp/o19/cuda.err
cd /tmp/o19 && tar czf $OUT/run19.tgz .
