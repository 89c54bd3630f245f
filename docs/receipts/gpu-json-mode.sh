#!/usr/bin/env bash
# JSON mode and logit_bias on the CUDA backend against the CPU backend, same synthetic model.
set -u
# Run from the repository root, with target/release/ferrite carried.
F=./target/release/ferrite
export FERRITE_HOME=/tmp/fh; mkdir -p $FERRITE_HOME
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
$F synth --preset smollm2-135m --type q4_1 --seed 1 -o /tmp/s.gguf 2>&1 | tail -1
sha256sum /tmp/s.gguf
for be in cuda cpu; do
  port=$([ $be = cuda ] && echo 8201 || echo 8202)
  $F serve -m /tmp/s.gguf --backend $be --port $port --parallel 4 > /tmp/serve-$be.log 2>&1 &
  pid=$!
  for _ in $(seq 1 120); do [[ $(curl -s -o /dev/null -w '%{http_code}' localhost:$port/health) == 200 ]] && break; sleep 0.5; done
  grep -m1 "backend=" /tmp/serve-$be.log
  python3 - $port $be <<'PY'
import json, sys, urllib.request
port, be = sys.argv[1], sys.argv[2]
def post(path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(), {"content-type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=120))
model = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models"))["data"][0]["id"]
done = 0
for i, (prompt, extra) in enumerate([("hello", {}), ("a b c", {}), ("x", {"temperature": 1.0, "seed": 3}),
                                     ("y", {"temperature": 1.0, "seed": 4, "top_p": 0.9}), ("z", {"temperature": 0.7, "seed": 5})]):
    v = post("/v1/completions", {"model": model, "prompt": prompt, "max_tokens": 200, "temperature": 0,
                                 "response_format": {"type": "json_object"}, **extra})
    c = v["choices"][0]
    ok = "-"
    if c["finish_reason"] == "stop":
        ok = type(json.loads(c["text"])).__name__
        done += 1
    print(f"{be} json {i}: finish={c['finish_reason']} parsed={ok} text={c['text'][:80]!r}")
print(f"{be} json closed {done}/5")
ids = post("/tokenize", {"content": "ab"})["tokens"]
v = post("/v1/completions", {"model": model, "prompt": "hello", "max_tokens": 4, "temperature": 0,
                             "logit_bias": {str(ids[0]): 100}})
print(f"{be} logit_bias +100 on {ids[0]}: {v['choices'][0]['text']!r}")
PY
  kill $pid; wait $pid 2>/dev/null
done
