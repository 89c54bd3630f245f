#!/usr/bin/env bash
# GPU smoke of one build on the device machine: the ferrite-cuda GPU lane (synthetic models),
# then `run` and `serve` on a synthetic SmolLM2-shaped model with --backend cuda against the
# device's own CPU backend (greedy, so the two texts should match), and the backend lines.
#
# Run from the repository root on the GPU machine with the stripped binaries carried as
# target/gpu/ferrite and target/gpu/gpu-lane (the `gpu` test binary of ferrite-cuda);
# `--no-lane` skips the lane.
# Everything it prints also lands in $OUT.
set -u
F=./target/gpu/ferrite
export FERRITE_HOME=/tmp/fh; mkdir -p "$FERRITE_HOME"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
sha256sum "$F" target/gpu/gpu-lane | tee -a "$OUT/gpu.txt"

if [[ ${1:-} != --no-lane ]]; then  # --no-lane: the lane already ran on this build
  bash crates/cuda/gpu-lane.sh target/gpu/gpu-lane > "$OUT/lane.txt" 2>&1
  echo "lane rc=$?"; grep -E '^test result|FAILED|panicked' "$OUT/lane.txt" | tail -5
fi

$F synth -o /tmp/synth.gguf --preset smollm2-135m > /dev/null
for be in cpu cuda; do
  $F run -m /tmp/synth.gguf --backend $be --max-tokens 48 --temp 0 -p "The quick brown fox" \
    > "$OUT/run-$be.txt" 2> /tmp/run-$be.err
  echo "run $be rc=$?"; grep -m1 'backend=' /tmp/run-$be.err "$OUT/run-$be.txt"
done
cmp -s "$OUT/run-cpu.txt" "$OUT/run-cuda.txt" && echo "run: cpu and cuda texts identical" \
  || echo "run: cpu and cuda texts DIFFER"

for be in cpu cuda; do
  port=$([ $be = cuda ] && echo 8311 || echo 8312)
  $F serve -m /tmp/synth.gguf --backend $be --port $port --parallel 4 > /tmp/serve-$be.log 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do
    python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=1)" 2>/dev/null && break
    sleep 0.5
  done
  grep -m1 'backend=' /tmp/serve-$be.log
  python3 - $port > "$OUT/serve-$be.json" <<'PY'
import json, sys, urllib.request, concurrent.futures as cf
base = f"http://127.0.0.1:{sys.argv[1]}"
def post(path, body):
    req = urllib.request.Request(base + path, json.dumps(body).encode(), {"content-type": "application/json"})
    r = urllib.request.urlopen(req, timeout=120)
    return json.load(r) if not body.get("stream") else r.read().decode()
prompts = [f"Item {i}: tell me about the number {i}" for i in range(8)]
body = lambda p: {"prompt": p, "max_tokens": 24, "temperature": 0}
with cf.ThreadPoolExecutor(8) as ex:  # concurrent: the batched decode path
    texts = list(ex.map(lambda p: post("/v1/completions", body(p))["choices"][0]["text"], prompts))
alone = [post("/v1/completions", body(p))["choices"][0]["text"] for p in prompts[:2]]
again = post("/v1/completions", body(prompts[0]))  # the same prompt twice: prefix reuse
stream = post("/v1/completions", {"prompt": prompts[0], "max_tokens": 24, "temperature": 0,
              "stream": True})  # synthetic models have no chat template
print(json.dumps({"batched": texts, "alone": alone, "batched_equals_alone": texts[:2] == alone,
                  "repeat_equal": again["choices"][0]["text"] == alone[0],
                  "stream_done": stream.rstrip().endswith("data: [DONE]")}, indent=1))
PY
  echo "serve $be client rc=$?"
  python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$port/metrics').read().decode())" \
    | grep -E 'prefix|cache' | head -8
  kill $pid; wait $pid 2>/dev/null
done
python3 - "$OUT" <<'PY'
import json, sys
a, b = (json.load(open(f"{sys.argv[1]}/serve-{be}.json")) for be in ("cpu", "cuda"))
print("serve: batched==alone cpu", a["batched_equals_alone"], "cuda", b["batched_equals_alone"])
print("serve: cuda texts equal cpu texts:", a["batched"] == b["batched"])
PY
