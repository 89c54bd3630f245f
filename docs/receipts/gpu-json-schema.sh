#!/usr/bin/env bash
# Structured outputs (response_format json_schema) on the CUDA backend against the CPU
# backend, same synthetic model: every whole output is checked against the schema by hand,
# and greedy and seeded texts must be identical on both backends.
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
  python3 - $port $be > "$OUT/schema-$be.txt" <<'PY'
import json, sys, urllib.request
port, be = sys.argv[1], sys.argv[2]
def post(path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(), {"content-type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=120))
schema = {"type": "object", "properties": {
    "flag": {"type": "boolean"}, "color": {"enum": ["red", "green", 7]},
    "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
    "note": {"anyOf": [{"type": "null"}, {"type": "integer"}]}},
    "required": ["flag", "color", "tags", "note"], "additionalProperties": False}
def fits(v):
    return (list(v) == ["flag", "color", "tags", "note"] and isinstance(v["flag"], bool)
            and v["color"] in ("red", "green", 7) and len(v["tags"]) <= 2
            and all(t in ("a", "b") for t in v["tags"])
            and (v["note"] is None or (isinstance(v["note"], int) and not isinstance(v["note"], bool))))
model = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models"))["data"][0]["id"]
fmt = {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}
whole = 0
for i, (prompt, extra) in enumerate([("hello", {}), ("a b c", {}), ("x", {"temperature": 1.0, "seed": 3}),
                                     ("y", {"temperature": 1.0, "seed": 4, "top_p": 0.9}), ("z", {"temperature": 0.7, "seed": 5})]):
    v = post("/v1/completions", {"model": model, "prompt": prompt, "max_tokens": 120, "temperature": 0,
                                 "response_format": fmt, **extra})
    c = v["choices"][0]
    ok = "-"
    if c["finish_reason"] == "stop":
        ok = fits(json.loads(c["text"]))
        assert ok, c["text"]
        whole += 1
    print(f"schema {i}: finish={c['finish_reason']} fits={ok} text={c['text']!r}")
print(f"whole {whole}/5")
PY
  tail -1 "$OUT/schema-$be.txt"
  kill $pid; wait $pid 2>/dev/null
done
if cmp -s "$OUT/schema-cuda.txt" "$OUT/schema-cpu.txt"; then echo "cuda and cpu outputs identical"; else echo "cuda and cpu outputs DIFFER"; diff "$OUT/schema-cuda.txt" "$OUT/schema-cpu.txt"; fi
