#!/usr/bin/env bash
# JSON mode's cost per token: the same prompts, greedy, with and without response_format.
set -euo pipefail
bin=$1; model=$2; log=$3
"$bin" serve -m "$model" --port 8094 --parallel 1 --threads 2 --kv-mem-space-mb 0 >"$log" 2>&1 &
pid=$!
for _ in $(seq 1 60); do [[ $(curl -s -o /dev/null -w '%{http_code}' localhost:8094/health) == 200 ]] && break; sleep 0.5; done
for fmt in text json_object text json_object; do
  for p in "Describe a dog as JSON." "Give me a JSON object describing Paris." "List three colors." "A person with a name and an age." "Describe the weather today."; do
    curl -s localhost:8094/v1/chat/completions -d '{"model":"smollm2-135m-instruct","messages":[{"role":"user","content":"'"$p"'"}],"max_tokens":64,"temperature":0,"response_format":{"type":"'$fmt'"}}' >/dev/null
  done
done
kill $pid; wait $pid 2>/dev/null || true
