# Device smoke of `ferrite serve --backend cuda`: 8 greedy /v1/completions answered
# concurrently must equal the same requests answered one at a time; the server's
# ferrite_batched_steps_total proves the concurrent ones shared steps. Then the same
# requests on --backend cpu (reported, not asserted: different kernels).
import json, subprocess, sys, threading, time, urllib.request, re

FERRITE, MODEL, BACKEND, OUT = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
PROMPTS = [("The quick brown fox " * (i + 1)) + f"number {i}:" for i in range(8)]

def start(backend, parallel):
    p = subprocess.Popen([FERRITE, "serve", "-m", MODEL, "--backend", backend, "--port", "0",
                          "--parallel", str(parallel), "--ctx", "1024"],
                         stderr=subprocess.PIPE, text=True)
    url, lines = None, []
    while True:
        line = p.stderr.readline()
        if not line:
            raise SystemExit("server exited: " + "".join(lines))
        lines.append(line)
        print("server:", line.rstrip(), flush=True)
        m = re.search(r"listening on (http://\S+)", line)
        if m:
            url = m.group(1)
        if "ready" in line and url:
            break
    threading.Thread(target=lambda: [print("server:", l.rstrip(), flush=True) for l in p.stderr],
                     daemon=True).start()
    return p, url, lines

def complete(url, prompt):
    body = json.dumps({"model": "s", "prompt": prompt, "max_tokens": 32,
                       "temperature": 0}).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        j = json.load(r)
    return j["choices"][0]["text"], j["usage"]["completion_tokens"]

def metric(url, name):
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return None

def run(backend):
    p, url, _ = start(backend, 16)
    try:
        seq = [complete(url, q) for q in PROMPTS]
        b0 = metric(url, "ferrite_batched_steps_total")
        conc = [None] * len(PROMPTS)
        def one(i):
            conc[i] = complete(url, PROMPTS[i])
        ts = [threading.Thread(target=one, args=(i,)) for i in range(len(PROMPTS))]
        t0 = time.time()
        [t.start() for t in ts]
        [t.join() for t in ts]
        wall = time.time() - t0
        b1 = metric(url, "ferrite_batched_steps_total")
        same = sum(a == b for a, b in zip(seq, conc))
        print(f"{backend}: 8 concurrent vs sequential: {same}/8 identical; batched steps "
              f"{b0} -> {b1}; concurrent wall {wall:.2f}s; tokens {[c[1] for c in conc]}", flush=True)
        return seq, conc, same, url, p
    except Exception:
        p.kill()
        raise

seq, conc, same, url, p = run(BACKEND)
json.dump({"seq": seq, "conc": conc}, open(f"{OUT}/smoke-{BACKEND}.json", "w"), indent=1)
if len(sys.argv) > 5:
    r = subprocess.run([FERRITE, "bench", "serve", "--url", url, "--concurrency", "1,4,16",
                        "--prompt-tokens", "128", "--max-tokens", "64", "--rounds", "2",
                        "--csv", f"{OUT}/bench-serve-{BACKEND}.csv"], capture_output=True, text=True)
    print(r.stdout[-3000:], r.stderr[-2000:], flush=True)
p.terminate()
p.wait(timeout=30)
if same != 8:
    for a, b in zip(seq, conc):
        print("SEQ ", repr(a)); print("CONC", repr(b))
    raise SystemExit("FAIL: concurrent answers differ")
print("smoke OK")
