#!/usr/bin/env bash
# Forced tool calls (tool_choice naming a tool) and open schema values on the CUDA backend
# against the CPU backend, same synthetic model: each whole call must name the tool and fit
# its parameters (checked by hand), and greedy and seeded outputs must be identical on both.
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
  python3 - $port > "$OUT/tools-$be.txt" <<'PY'
import json, sys, urllib.request
port = sys.argv[1]
def post(path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(), {"content-type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=120))
params = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
          "required": ["city"]}
tools = [{"type": "function", "function": {"name": "get_time"}},
         {"type": "function", "function": {"name": "get_weather", "parameters": params}}]
def fits(a):
    return set(a) <= {"city", "unit"} and isinstance(a.get("city"), str) and a.get("unit", "c") in ("c", "f")
model = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models"))["data"][0]["id"]
whole = 0
for i, extra in enumerate([{}, {"temperature": 1.0, "seed": 3}, {"temperature": 0.8, "seed": 4, "top_p": 0.9}]):
    v = post("/v1/chat/completions", {"model": model, "max_tokens": 120, "temperature": 0,
        "messages": [{"role": "user", "content": f"weather {i}"}], "tools": tools,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, **extra})
    c = v["choices"][0]
    if c["finish_reason"] == "tool_calls":
        f = c["message"]["tool_calls"][0]["function"]
        assert f["name"] == "get_weather" and fits(json.loads(f["arguments"])), v
        whole += 1
        print(f"call {i}: {f['name']} {f['arguments']}")
    else:
        print(f"call {i}: finish={c['finish_reason']} text={c['message']['content']!r}")
open_schema = {"type": "object", "properties": {"m": {"type": "object", "additionalProperties": {"type": "integer"}},
               "any": {}}, "required": ["m", "any"]}
v = post("/v1/completions", {"model": model, "prompt": "x", "max_tokens": 120, "temperature": 0,
    "response_format": {"type": "json_schema", "json_schema": {"name": "o", "schema": open_schema}}})
c = v["choices"][0]
if c["finish_reason"] == "stop":
    o = json.loads(c["text"])
    assert list(o) == ["m", "any"] and all(isinstance(x, int) for x in o["m"].values()), c["text"]
print(f"open schema: finish={c['finish_reason']} text={c['text']!r}")
print(f"whole calls {whole}/3")
PY
  tail -2 "$OUT/tools-$be.txt"
  kill $pid; wait $pid 2>/dev/null
done
if cmp -s "$OUT/tools-cuda.txt" "$OUT/tools-cpu.txt"; then echo "cuda and cpu outputs identical"; else echo "cuda and cpu outputs DIFFER"; diff "$OUT/tools-cuda.txt" "$OUT/tools-cpu.txt"; fi
