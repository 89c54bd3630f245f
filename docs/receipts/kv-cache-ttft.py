# TTFT of the second request of a long conversation: cold server vs restored from disk
# after a restart vs the same warm server (memory). Usage: python3 kv_ttft.py FERRITE MODEL
import json, os, subprocess, sys, tempfile, time, urllib.request, statistics, re

FERRITE, MODEL = sys.argv[1], sys.argv[2]
TEXT = open(os.environ.get("GPL3", "fixtures/reference/GPL-3.txt")).read()[:14000]
SYSTEM = {"role": "system", "content": "You are a careful assistant."}
U1 = {"role": "user", "content": "Read this licence:\n\n" + TEXT + "\n\nSummarize it in one sentence."}

def start(extra):
    p = subprocess.Popen([FERRITE, "serve", "-m", MODEL, "--port", "0", "--ctx", "4096", "--parallel", "1",
                          "--threads", "2"] + extra, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    addr = None
    log = []
    while True:
        line = p.stderr.readline()
        log.append(line)
        m = re.match(r"listening on (http://\S+)", line)
        if m: addr = m.group(1)
        if "ready" in line: break
        if not line: raise SystemExit("".join(log))
    import threading
    def drain():
        for l in p.stderr: log.append(l)
    threading.Thread(target=drain, daemon=True).start()
    return p, addr, log

def chat(addr, messages, stream=False):
    body = json.dumps({"model": os.path.basename(MODEL), "messages": messages, "max_tokens": 16, "temperature": 0,
                       "stream": stream, "stream_options": {"include_usage": True}}).encode()
    req = urllib.request.Request(addr + "/v1/chat/completions", body, {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    ttft, text, usage = None, "", None
    with urllib.request.urlopen(req, timeout=600) as r:
        if not stream:
            v = json.load(r)
            return time.perf_counter() - t0, v["choices"][0]["message"]["content"], v["usage"]
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]": continue
            v = json.loads(line[6:])
            if v.get("usage"): usage = v["usage"]
            for c in v.get("choices", []):
                d = c.get("delta", {}).get("content")
                if d:
                    if ttft is None: ttft = time.perf_counter() - t0
                    text += d
    return ttft, text, usage

def second(reply):
    return [SYSTEM, U1, {"role": "assistant", "content": reply}, {"role": "user", "content": "Now name one obligation it imposes."}]

res = {"cold": [], "disk": [], "memory": []}
for trial in range(int(os.environ.get("TRIALS", "3"))):
    d = tempfile.mkdtemp()
    p, addr, log = start(["--kv-disk-dir", d])
    _, reply, u1 = chat(addr, [SYSTEM, U1])
    # wait for the checkpoint file
    t = time.time()
    while not any("kv-cache: wrote" in l for l in log) and time.time() - t < 60: time.sleep(0.05)
    ttft, text_mem, u = chat(addr, second(reply), stream=True)
    res["memory"].append((ttft, u))
    p.kill(); p.wait()
    p, addr, log = start(["--kv-disk-dir", d])
    ttft, text_disk, u = chat(addr, second(reply), stream=True)
    res["disk"].append((ttft, u))
    p.kill(); p.wait()
    p, addr, log = start(["--kv-mem-space-mb", "0"])
    ttft, text_cold, u = chat(addr, second(reply), stream=True)
    res["cold"].append((ttft, u))
    p.kill(); p.wait()
    assert text_mem == text_disk == text_cold, (text_mem, text_disk, text_cold)
    print(f"trial {trial}: first prompt {u1['prompt_tokens']} tokens; second answers identical: {text_cold!r}", flush=True)
for k, v in res.items():
    ts = [x[0] for x in v]
    u = v[-1][1]
    print(f"{k:7s} ttft median {statistics.median(ts)*1e3:.0f} ms (min {min(ts)*1e3:.0f}, max {max(ts)*1e3:.0f}) "
          f"prompt_tokens {u['prompt_tokens']} cached {u['prompt_tokens_details']['cached_tokens']} source {u['ferrite']['cache_source']}")
