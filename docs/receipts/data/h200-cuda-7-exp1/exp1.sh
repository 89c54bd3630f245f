#!/usr/bin/env bash
# Session 7 experiment 1: matvec loops unrolled by 2 (B) against the current kernels (A).
cd "$(dirname "$0")"; chmod +x ferrite-a ferrite-b
export FERRITE_HOME=/tmp/fh7; mkdir -p $FERRITE_HOME /tmp/o7e1
( time ./ferrite-a synth --preset llama-8b --type q4_k_m --seed 1 -o /tmp/l.gguf ) > /tmp/o7e1/synth.txt 2>&1
./ferrite-a synth --preset smollm2-135m --type q4_1 --seed 1 -o /tmp/s.gguf >> /tmp/o7e1/synth.txt 2>&1
sha256sum /tmp/l.gguf /tmp/s.gguf >> /tmp/o7e1/synth.txt; tail -3 /tmp/o7e1/synth.txt
for v in a b; do ./ferrite-$v run -m /tmp/s.gguf --backend cuda --raw --max-tokens 24 --temp 0 "the quick brown fox" > /tmp/o7e1/text-$v.txt 2>/tmp/o7e1/text-$v.err; done
cmp -s /tmp/o7e1/text-a.txt /tmp/o7e1/text-b.txt && test -s /tmp/o7e1/text-a.txt && echo "texts identical" || echo "texts differ"
for round in 1 2; do for v in a b; do for m in l s; do
  FERRITE_GIT_COMMIT=exp1-$v ./ferrite-$v bench -m /tmp/$m.gguf --backend cuda --ctx-start 512 --ctx-max 512 --gen-tokens 128 --runs 3 --csv /tmp/o7e1/bench-$m-$v-$round.csv > /tmp/o7e1/bench-$m-$v-$round.txt 2>&1
  echo "$round $v $m: $(grep -E '^ *512' /tmp/o7e1/bench-$m-$v-$round.txt | tail -1)"
done; done; done
cd /tmp/o7e1 && tar czf $OUT/exp1.tgz .
