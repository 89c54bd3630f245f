#!/usr/bin/env python3
"""TTFT of a long conversation's second request with and without `--load-session`.

Usage: kv-cache-ttft-run.py FERRITE WORKDIR OUTDIR [BACKEND ...]   (default backends: cuda cpu)

Makes a SmolLM2-shaped random-weight model (`ferrite synth --preset smollm2-135m --type q4_1`)
and a made-up English text whose first part (the shared prefix, >= 3,000 tokens) is request 1;
request 2 is the prefix plus a short new turn. Per backend: request 1 once with
`--save-session` (the checkpoint), one warm-up, then TRIALS alternating runs of request 2
without and with `--load-session`, all greedy (`--temp 0`), same `--ctx`. Records the CLI's
clocks (load, ttft, prefill tok/s), the session restore line (model sha256, read+check, device
upload), the process wall time and the generated text (fresh and cached must agree to count as
a correct run). One more cached run with an empty FERRITE_HOME shows an uncached model sha256.
"""
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time

TRIALS = int(os.environ.get("TRIALS", "3"))
CTX = "4096"

ferrite, work, out = sys.argv[1], sys.argv[2], sys.argv[3]
backends = sys.argv[4:] or ["cuda", "cpu"]
os.makedirs(work, exist_ok=True)
os.makedirs(out, exist_ok=True)
model = os.path.join(work, "smollm2-shape-q4_1.gguf")
home = os.path.join(work, "home")
log = open(os.path.join(out, "runs.log"), "w")


def run(args, env_home=home):
    env = dict(os.environ, FERRITE_HOME=env_home)
    t = time.perf_counter()
    p = subprocess.run([ferrite] + args, capture_output=True, text=True, env=env)
    wall = (time.perf_counter() - t) * 1e3
    log.write(f"$ ferrite {' '.join(a if len(a) < 80 else a[:40] + '...' for a in args)}\n")
    log.write(p.stderr + f"[stdout] {p.stdout!r}\n[wall] {wall:.1f} ms rc={p.returncode}\n\n")
    log.flush()
    if p.returncode != 0:
        sys.exit(f"ferrite failed: {p.stderr}")
    if args[0] == "synth":
        return None
    m = re.search(r"load (\d+) ms \| ttft (\d+) ms \| prefill ([\d.]+) tok/s \| decode ([\d.]+) "
                  r"tok/s \| tokens in (\d+) out (\d+)", p.stderr)
    r = {"load_ms": int(m[1]), "ttft_ms": int(m[2]), "prefill_tps": float(m[3]),
         "tokens_in": int(m[5]), "wall_ms": wall, "text": p.stdout, "stderr": p.stderr}
    s = re.search(r"session: model sha256 ([\d.]+) ms, read and checked (\d+) KV bytes in "
                  r"([\d.]+) ms, restored in ([\d.]+) ms", p.stderr)
    if s:
        r.update(sha_ms=float(s[1]), kv_bytes=int(s[2]), read_ms=float(s[3]),
                 restore_ms=float(s[4]))
        r["ttft_incl_restore_ms"] = r["ttft_ms"] + r["sha_ms"] + r["read_ms"] + r["restore_ms"]
    u = re.search(r"session: reusing (\d+) of (\d+)", p.stderr)
    if u:
        r["reused"], r["prompt_tokens"] = int(u[1]), int(u[2])
    b = re.search(r"^backend=.*$", p.stderr, re.M)
    r["backend_line"] = b[0] if b else None
    return r


if not os.path.exists(model):
    run(["synth", "--preset", "smollm2-135m", "--type", "q4_1", "-o", model])
rng = random.Random(1)
words = ("the of and a to in is you that it he was for on are as with his they at be this have "
         "from or one had by word but not what all were we when your can said there use an each "
         "which she do how their if will up other about out many then them these so some her "
         "would make like him into time has look two more write go see number no way could "
         "people my than first water been call who oil its now find long down day did get come "
         "made may part").split()
prefix = " ".join(rng.choice(words) for _ in range(1300))
turn = "\n\nQuestion: which word came up most often above?\nAnswer:"
common = ["run", "-m", model, "--raw", "--ctx", CTX, "--temp", "0", "--max-tokens", "8"]
result = {"model_bytes": os.path.getsize(model), "trials": TRIALS, "backends": {}}
for be in backends:
    snap = os.path.join(work, f"prefix-{be}.kvsnap")
    save = run(common + ["--backend", be, "-p", prefix, "--save-session", snap])
    warm = run(common + ["--backend", be, "-p", prefix + turn])
    fresh, cached = [], []
    for _ in range(TRIALS):
        fresh.append(run(common + ["--backend", be, "-p", prefix + turn]))
        cached.append(run(common + ["--backend", be, "-p", prefix + turn, "--load-session", snap]))
    cold_sha = run(common + ["--backend", be, "-p", prefix + turn, "--load-session", snap],
                   env_home=os.path.join(work, f"empty-home-{be}"))
    med = lambda rs, k: statistics.median(r[k] for r in rs)
    rng_ = lambda rs, k: (min(r[k] for r in rs), max(r[k] for r in rs))
    texts_agree = all(r["text"] == fresh[0]["text"] for r in fresh + cached + [warm, cold_sha])
    result["backends"][be] = {
        "backend_line": fresh[0]["backend_line"],
        "prefix_tokens": save["tokens_in"],
        "request2_tokens": fresh[0]["tokens_in"],
        "reused": cached[0].get("reused"),
        "evaluated_with_cache": cached[0]["tokens_in"],
        "snapshot_bytes": os.path.getsize(snap),
        "fresh_ttft_ms_median": med(fresh, "ttft_ms"), "fresh_ttft_ms_range": rng_(fresh, "ttft_ms"),
        "fresh_prefill_tps_median": med(fresh, "prefill_tps"),
        "cached_ttft_ms_median": med(cached, "ttft_ms"), "cached_ttft_ms_range": rng_(cached, "ttft_ms"),
        "cached_ttft_incl_restore_ms_median": med(cached, "ttft_incl_restore_ms"),
        "cached_ttft_incl_restore_ms_range": rng_(cached, "ttft_incl_restore_ms"),
        "sha_ms_median_cached_digest": med(cached, "sha_ms"),
        "read_ms_median": med(cached, "read_ms"), "restore_ms_median": med(cached, "restore_ms"),
        "sha_ms_uncached": cold_sha["sha_ms"],
        "fresh_wall_ms_median": med(fresh, "wall_ms"), "cached_wall_ms_median": med(cached, "wall_ms"),
        "load_ms_median": med(fresh, "load_ms"),
        "generated_text_identical": texts_agree,
        "text_fresh": fresh[0]["text"], "text_cached": cached[0]["text"],
        "per_run": [{k: v for k, v in r.items() if k not in ("stderr", "text")} for r in fresh + cached],
    }
    print(json.dumps({k: v for k, v in result["backends"][be].items() if k != "per_run"}, indent=1))
json.dump(result, open(os.path.join(out, "ttft.json"), "w"), indent=1)
