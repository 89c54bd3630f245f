#!/usr/bin/env bash
# Device run 21 (session 11): the whole GPU lane with both real models required
# (FERRITE_TEST_MODELS=1), the host CPU's references on q16 (packed rows; binaries of 5ef866a).
cd "$(dirname "$0")"; chmod +x ferrite gpu
export FERRITE_HOME=/tmp/fh; mkdir -p $FERRITE_HOME /tmp/o21
cp target/qp2/pai /tmp/parts/ 2>/dev/null; cp ../qp2/pai /tmp/parts/ 2>/dev/null; ls /tmp/parts
cat /tmp/parts/p* | tar xzf - -C $FERRITE_HOME
sha256sum $FERRITE_HOME/models/*.gguf | tee /tmp/o21/models.txt
grep -q b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 /tmp/o21/models.txt || { echo "smollm2 hash mismatch"; exit 2; }
grep -q a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 /tmp/o21/models.txt || { echo "gemma3 hash mismatch"; exit 2; }
(cd ../.. && FERRITE_TEST_CUDA=1 FERRITE_TEST_MODELS=1 timeout 500 target/gpu-main/gpu --test-threads 1 > /tmp/o21/lane.txt 2>&1; echo "lane rc=$?"; grep -E "FAILED|panicked|test result" /tmp/o21/lane.txt | head -20)
./ferrite run -m $FERRITE_HOME/models/SmolLM2-135M-Instruct.Q4_1.gguf --backend cpu --temp 0 --max-tokens 48 "Why is the sky blue?" > /tmp/o21/cpu.txt 2> /tmp/o21/cpu.err
./ferrite run -m $FERRITE_HOME/models/SmolLM2-135M-Instruct.Q4_1.gguf --backend cuda --temp 0 --max-tokens 48 "Why is the sky blue?" > /tmp/o21/cuda.txt 2> /tmp/o21/cuda.err
head -c 400 /tmp/o21/cpu.txt; echo; head -c 400 /tmp/o21/cuda.txt; echo
[ -s /tmp/o21/cpu.txt ] && cmp /tmp/o21/cpu.txt /tmp/o21/cuda.txt && echo "greedy text identical" || echo "greedy text differs or empty"
tail -1 /tmp/o21/cpu.err; tail -1 /tmp/o21/cuda.err
cd /tmp/o21 && tar czf $OUT/run21.tgz .
