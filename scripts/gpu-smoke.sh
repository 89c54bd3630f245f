#!/usr/bin/env bash
# GPU smoke of one build on the device machine: the ferrite-cuda GPU lane (synthetic models),
# then `run` and `serve` on synthetic models (the SmolLM2 shape and two hybrids) with
# --backend cuda against the device's own CPU backend (greedy, so the two texts should match
# unless a random model's near-tie flips), and the backend lines.
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

# One synthetic model per path: the SmolLM2 shape runs the CUDA model; the hybrids (gated
# DeltaNet with routed and shared experts, Mamba-2) run the contract pass, whose backend
# line says pass=contract.
smoke() {
  local name=$1; shift
  $F synth -o /tmp/$name.gguf "$@" > /dev/null || { echo "$name: synth failed"; return; }
  for be in cpu cuda; do
    $F run -m /tmp/$name.gguf --backend $be --max-tokens 48 --temp 0 -p "The quick brown fox" \
      > "$OUT/run-$name-$be.txt" 2> /tmp/run-$be.err
    echo "$name run $be rc=$?"; grep -m1 'backend=' /tmp/run-$be.err "$OUT/run-$name-$be.txt"
  done
  cmp -s "$OUT/run-$name-cpu.txt" "$OUT/run-$name-cuda.txt" && echo "$name run: cpu and cuda texts identical" \
    || echo "$name run: cpu and cuda texts DIFFER"
  for be in cpu cuda; do
    port=$([ $be = cuda ] && echo 8311 || echo 8312)
    $F serve -m /tmp/$name.gguf --backend $be --port $port --parallel 4 > /tmp/serve-$be.log 2>&1 &
    pid=$!
    for _ in $(seq 1 600); do
      python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=1)" 2>/dev/null && break
      sleep 0.5
    done
    grep -m1 -E 'backend=|rror' /tmp/serve-$be.log
    python3 - $port > "$OUT/serve-$name-$be.json" <<'PY'
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
    echo "$name serve $be client rc=$?"
    python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$port/metrics').read().decode())" \
      | grep -E 'prefix|cache' | head -8
    kill $pid; wait $pid 2>/dev/null
  done
  python3 - "$OUT" $name <<'PY'
import json, sys
a, b = (json.load(open(f"{sys.argv[1]}/serve-{sys.argv[2]}-{be}.json")) for be in ("cpu", "cuda"))
print(sys.argv[2], "serve: batched==alone cpu", a["batched_equals_alone"], "cuda", b["batched_equals_alone"])
print(sys.argv[2], "serve: repeat equal cpu", a["repeat_equal"], "cuda", b["repeat_equal"])
n = sum(x == y for x, y in zip(a["batched"], b["batched"]))
print(sys.argv[2], f"serve: cuda texts equal cpu texts: {n}/{len(a['batched'])}")
PY
}
smoke smollm2 --preset smollm2-135m
smoke qwen3next --arch qwen3next --hidden 256 --layers 4 --heads 4 --kv-heads 2 --ffn 256 --vocab 4096
smoke nemotron_h --arch nemotron_h --hidden 256 --layers 8 --heads 4 --kv-heads 2 --ffn 512 --vocab 4096
