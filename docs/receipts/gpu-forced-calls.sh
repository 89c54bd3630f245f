#!/usr/bin/env bash
# Forced tool calls (`tool_choice` naming a tool, "required", "auto", "none") on the CUDA
# backend against the device's CPU backend, with the real SmolLM2 (its chat template renders
# the tools). Every call must name an offered tool (the named one when named) with
# arguments that fit its parameters; greedy and seeded outputs are compared across backends.
#
# Run from the repository root on the GPU machine, with the stripped binary carried as
# target/gpu/ferrite and the model's split parts (`split -b 33M`) gathered in /tmp/parts (sent one run at a time).
set -u
F=./target/gpu/ferrite
export FERRITE_HOME=/tmp/fh; mkdir -p $FERRITE_HOME
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cat /tmp/parts/smol.* > /tmp/smol.gguf
sha256sum /tmp/smol.gguf
for be in cuda cpu; do
  port=$([ $be = cuda ] && echo 8211 || echo 8212)
  $F serve -m /tmp/smol.gguf --backend $be --port $port --parallel 4 > /tmp/serve-$be.log 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do [[ $(curl -s -o /dev/null -w "%{http_code}" localhost:$port/health) == 200 ]] && break; sleep 0.5; done
  grep -m1 "backend=" /tmp/serve-$be.log
  python3 - $port > "$OUT/calls-$be.txt" <<'PY'
import json, sys, urllib.request
port = sys.argv[1]
base = f"http://127.0.0.1:{port}"
def post(body):
    req = urllib.request.Request(base + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"content-type": "application/json"})
    resp = urllib.request.urlopen(req, timeout=120)
    if not body.get("stream"):
        return json.load(resp)
    # Streamed: gather the tool_calls deltas and the finish reason into one message.
    calls, content, finish = {}, "", None
    for line in resp.read().decode().splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        choice = json.loads(line[6:])["choices"][0]
        finish = choice.get("finish_reason") or finish
        delta = choice["delta"]
        content += delta.get("content") or ""
        for d in delta.get("tool_calls") or []:
            c = calls.setdefault(d["index"], {"function": {"name": "", "arguments": ""}})
            c["function"]["name"] += d.get("function", {}).get("name") or ""
            c["function"]["arguments"] += d.get("function", {}).get("arguments") or ""
    msg = {"content": content or None, "tool_calls": [calls[i] for i in sorted(calls)] or None}
    return {"choices": [{"finish_reason": finish, "message": msg}]}
weather = {"type": "object", "properties": {"city": {"type": "string"},
           "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}
clock = {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}
params = {"get_weather": weather, "get_time": clock}
tools = [{"type": "function", "function": {"name": n, "description": d, "parameters": p}}
         for n, d, p in [("get_weather", "Current weather in a city", weather),
                         ("get_time", "Current time in a time zone", clock)]]
def fits(name, args):
    p = params[name]
    return (set(args) <= set(p["properties"]) and set(p["required"]) <= set(args)
            and all(type(v) is str for v in args.values())
            and args.get("unit", "c") in ("c", "f"))
model = json.load(urllib.request.urlopen(base + "/v1/models"))["data"][0]["id"]
named = lambda n: {"type": "function", "function": {"name": n}}
cases = [
    ("What's the weather in Paris?", named("get_weather"), {}),
    ("What time is it in Tokyo?", "required", {}),
    ("Tell me about Rome.", named("get_time"), {"temperature": 0.7, "seed": 5}),
    ("Weather or time in Lima?", "required", {"temperature": 0.8, "seed": 6, "stream": True}),
    ("What's the weather in Paris?", "auto", {}),
    ("What's the weather in Paris?", "none", {}),
]
bad = 0
for i, (prompt, choice, extra) in enumerate(cases):
    v = post({"model": model, "messages": [{"role": "user", "content": prompt}], "tools": tools,
              "tool_choice": choice, "max_tokens": 100, "temperature": 0, **extra})
    c = v["choices"][0]
    calls = c["message"].get("tool_calls") or []
    verdict = "ok"
    for call in calls:
        name, args = call["function"]["name"], json.loads(call["function"]["arguments"])
        if not fits(name, args) or (isinstance(choice, dict) and name != choice["function"]["name"]):
            verdict = "BAD"
    if choice == "none" and calls:
        verdict = "BAD"
    if choice != "auto" and choice != "none" and not calls and c["finish_reason"] != "length":
        verdict = "BAD"
    bad += verdict == "BAD"
    shown = [(x["function"]["name"], x["function"]["arguments"]) for x in calls]
    print(f"{i} {verdict} choice={json.dumps(choice)} finish={c['finish_reason']} calls={shown} "
          f"content={c['message'].get('content')!r}")
print(f"bad {bad}/{len(cases)}")
PY
  cat "$OUT/calls-$be.txt"
  kill $pid; wait $pid 2>/dev/null
done
if cmp -s "$OUT/calls-cuda.txt" "$OUT/calls-cpu.txt"; then echo "cuda and cpu outputs identical"; else echo "cuda and cpu outputs DIFFER"; fi
