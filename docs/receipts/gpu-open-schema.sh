#!/usr/bin/env bash
# Open schema values (a map of integers, an untyped value) and JSON mode on the CUDA backend
# against the CPU backend, same synthetic model: each whole output must fit (checked by
# hand), and greedy and seeded outputs must be identical on both. Forced tool calls take the
# same grammar and sampler on the host; they need a chat template, which synthetic models
# lack (chat endpoints answer 400 there), so they are not run here.
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
  for _ in $(seq 1 600); do [[ $(curl -s -o /dev/null -w "%{http_code}" localhost:$port/health) == 200 ]] && break; sleep 0.5; done
  grep -m1 "backend=" /tmp/serve-$be.log
  python3 - $port > "$OUT/open-$be.txt" <<'PY'
import json, sys, urllib.request
port = sys.argv[1]
def post(path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(), {"content-type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=120))
open_schema = {"type": "object", "properties": {"m": {"type": "object", "additionalProperties": {"type": "integer"}},
               "any": {}}, "required": ["m", "any"]}
model = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models"))["data"][0]["id"]
whole = 0
formats = [{"type": "json_schema", "json_schema": {"name": "o", "schema": open_schema}}, {"type": "json_object"}]
for i, (fmt, extra) in enumerate([(f, e) for f in formats for e in
        [{}, {"temperature": 1.0, "seed": 3}, {"temperature": 0.8, "seed": 4, "top_p": 0.9}]]):
    v = post("/v1/completions", {"model": model, "prompt": f"x {i}", "max_tokens": 120, "temperature": 0,
                                 "response_format": fmt, **extra})
    c = v["choices"][0]
    if c["finish_reason"] == "stop":
        o = json.loads(c["text"])
        if fmt["type"] == "json_schema":
            assert list(o) == ["m", "any"] and all(type(x) is int for x in o["m"].values()), c["text"]
        whole += 1
    print(f"{fmt['type']} {i}: finish={c['finish_reason']} text={c['text']!r}")
print(f"whole {whole}/6")
PY
  tail -2 "$OUT/open-$be.txt"
  kill $pid; wait $pid 2>/dev/null
done
if cmp -s "$OUT/open-cuda.txt" "$OUT/open-cpu.txt"; then echo "cuda and cpu outputs identical"; else echo "cuda and cpu outputs DIFFER"; diff "$OUT/open-cuda.txt" "$OUT/open-cpu.txt"; fi
