#!/usr/bin/env bash
# Session 7 experiment 2: __launch_bounds__(128, 12 or 16) on the matvec, matvec3 and gated
# kernels (lb12, lb16) against the current kernels (a).
cd "$(dirname "$0")"; chmod +x ferrite-*
export FERRITE_HOME=/tmp/fh7; mkdir -p $FERRITE_HOME /tmp/o7e2
test -f /tmp/l.gguf || ./ferrite-a synth --preset llama-8b --type q4_k_m --seed 1 -o /tmp/l.gguf > /tmp/o7e2/synth.txt 2>&1
test -f /tmp/s.gguf || ./ferrite-a synth --preset smollm2-135m --type q4_1 --seed 1 -o /tmp/s.gguf >> /tmp/o7e2/synth.txt 2>&1
sha256sum /tmp/l.gguf /tmp/s.gguf >> /tmp/o7e2/synth.txt; tail -2 /tmp/o7e2/synth.txt
for v in a lb12 lb16; do ./ferrite-$v run -m /tmp/s.gguf --backend cuda --raw --max-tokens 24 --temp 0 "the quick brown fox" > /tmp/o7e2/text-$v.txt 2>/tmp/o7e2/text-$v.err; done
for v in lb12 lb16; do test -s /tmp/o7e2/text-a.txt && cmp -s /tmp/o7e2/text-a.txt /tmp/o7e2/text-$v.txt && echo "$v: text identical" || echo "$v: text differs"; done
for round in 1 2; do for v in a lb12 lb16; do for m in l s; do
  FERRITE_GIT_COMMIT=exp2-$v ./ferrite-$v bench -m /tmp/$m.gguf --backend cuda --ctx-start 512 --ctx-max 512 --gen-tokens 128 --runs 3 --csv /tmp/o7e2/bench-$m-$v-$round.csv > /tmp/o7e2/bench-$m-$v-$round.txt 2>&1
  echo "$round $v $m: $(grep -E '^ *512' /tmp/o7e2/bench-$m-$v-$round.txt | tail -1)"
done; done; done
cd /tmp/o7e2 && tar czf $OUT/exp2.tgz .
