#!/usr/bin/env bash
# Device run 11 (session 7): the full lane with both real models required, and real-model
# Q4_0/BF16 requantizations, greedy text on CUDA against the CPU backend.
cd "$(dirname "$0")"; chmod +x ferrite gpu
export FERRITE_HOME=/tmp/fh FERRITE_CUDA_COUNTS=1; mkdir -p $FERRITE_HOME /tmp/o12s
ls $FERRITE_HOME/models > /tmp/o12s/models.txt


S=$FERRITE_HOME/models/SmolLM2-135M-Instruct.Q4_1.gguf
for t in q4_0 bf16; do
  ./ferrite quantize --allow-requantize --type $t $S /tmp/s-$t.gguf > /tmp/o12s/quantize-$t.txt 2>&1
  for be in cpu cuda; do
    ./ferrite run -m /tmp/s-$t.gguf --backend $be --max-tokens 48 --temp 0 "Name three primary colors and say why." > /tmp/o12s/run-$t-$be.txt 2> /tmp/o12s/run-$t-$be.err
  done
  test -s /tmp/o12s/run-$t-cpu.txt && cmp -s /tmp/o12s/run-$t-cpu.txt /tmp/o12s/run-$t-cuda.txt && echo "$t: cpu and cuda text identical" || echo "$t: texts differ"
  grep -hE "backend=|launch" /tmp/o12s/run-$t-cuda.err | head -3
  grep -oE "(matvec[a-z0-9_]*|embed)_(q4_0|bf16)[^ ]*" /tmp/o12s/run-$t-cuda.err | sort -u | head -8 | tr '\n' ' '; echo
done
for p in dequant mmq; do FERRITE_CUDA_PREFILL=$p ./ferrite run -m $S --backend cuda --max-tokens 24 --temp 0 "Name three primary colors." > /tmp/o12s/prefill-$p.txt 2>/tmp/o12s/prefill-$p.err; echo "prefill=$p rc=$?"; done
cd /tmp/o12s && tar czf $OUT/run11.tgz .
