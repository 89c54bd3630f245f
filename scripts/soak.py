#!/usr/bin/env python3
"""Soak `ferrite serve`: many concurrent streaming clients for a fixed time, RSS sampled.

Starts `ferrite serve` on loopback (port 0), runs CLIENTS threads that each loop over
streaming chat and completion requests of mixed prompt and answer lengths (prompts share
a few long prefixes, so the prefix cache fills and evicts), about DISCONNECT of them
hanging up mid-stream. Every STEP seconds it reads the server's resident set from
/proc/PID/status and its /metrics gauges. Bounded: the run stops at DURATION seconds or
after MAX_REQUESTS requests, whichever comes first, and every socket has a timeout.

The rule (flat RSS after warm-up): split the samples into thirds by time; the first third
is warm-up. Pass when the largest RSS of the last third is at most the largest of the
second third plus TOLERANCE_MB; the same holds for the RSS less the prefix cache's
accounted bytes (so memory growing outside the caches shows even while the cache still
fills); every sample's cache bytes are within their budgets; no request got a 5xx or a
broken stream; and the server is alive at the end. The cache must fill during warm-up for
the first part to mean a plateau: on a slow or shared machine give a smaller
`--kv-mem-space-mb` (the receipt names it).

Writes a markdown receipt (--receipt) and exits 0 on pass, 1 on fail. Python stdlib only.
"""

import argparse
import http.client
import json
import os
import platform
import random
import re
import subprocess
import sys
import threading
import time

WORDS = (
    "river stone market winter engine garden signal copper harbor lantern orbit meadow "
    "thread canyon ledger violet summit anchor prism falcon marble quartz willow ember "
    "compass glacier velvet harvest beacon cipher tundra saddle cobalt"
).split()


def text_of(rng, n_words):
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


class Stats:
    """Counters shared by the client threads."""

    def __init__(self):
        self.lock = threading.Lock()
        self.counts = {}
        self.errors = []

    def add(self, key, detail=None):
        with self.lock:
            self.counts[key] = self.counts.get(key, 0) + 1
            if detail is not None and len(self.errors) < 20:
                self.errors.append(detail)

    def total(self):
        with self.lock:
            return sum(v for k, v in self.counts.items() if k.startswith("req_"))


def one_request(addr, rng, prefixes, disconnect, timeout):
    """One streaming request; returns its outcome key (and an error detail or None)."""
    prefix = rng.choice(prefixes)
    question = text_of(rng, rng.choice([3, 10, 40, 120]))
    max_tokens = rng.choice([4, 16, 32, 64, 128])
    if rng.random() < 0.5:
        path = "/v1/chat/completions"
        body = {
            "messages": [
                {"role": "system", "content": prefix},
                {"role": "user", "content": question},
            ],
            "max_tokens": max_tokens,
            "stream": True,
            "temperature": rng.choice([0, 0.8]),
        }
    else:
        path = "/v1/completions"
        body = {
            "prompt": prefix + " " + question,
            "max_tokens": max_tokens,
            "stream": True,
            "temperature": rng.choice([0, 0.8]),
        }
    hang_up_after = rng.randint(1, 6) if rng.random() < disconnect else None
    conn = http.client.HTTPConnection(addr[0], addr[1], timeout=timeout)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status == 429:
            resp.read()
            return "req_429", None
        if resp.status != 200:
            return "req_status_%d" % resp.status, resp.read()[:200]
        events = 0
        done = False
        for raw in resp:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            events += 1
            if line == b"data: [DONE]":
                done = True
                break
            if hang_up_after is not None and events >= hang_up_after:
                return "req_disconnected", None
        if not done:
            return "req_broken_stream", "stream ended without [DONE] after %d events" % events
        return "req_ok", None
    except (OSError, http.client.HTTPException) as e:
        return "req_transport_error", repr(e)
    finally:
        conn.close()


def client(addr, seed, prefixes, args, stop, stats):
    rng = random.Random(seed)
    while not stop.is_set():
        if stats.total() >= args.max_requests:
            stop.set()
            return
        key, detail = one_request(addr, rng, prefixes, args.disconnect, args.request_timeout)
        # Requests cut off by the end of the run are not outcomes.
        if stop.is_set():
            return
        stats.add(key, detail)
        if key == "req_429":
            time.sleep(0.2 + rng.random() * 0.3)


def get(addr, path, timeout=10):
    conn = http.client.HTTPConnection(addr[0], addr[1], timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read().decode("utf-8", "replace")
    finally:
        conn.close()


def rss_bytes(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS for pid %d" % pid)


GAUGE = re.compile(r"^(ferrite_[a-z_]+) ([0-9.e+]+)$", re.M)


def gauges(text):
    return {m.group(1): float(m.group(2)) for m in GAUGE.finditer(text)}


def start_server(args):
    cmd = [args.binary, "serve", "--host", "127.0.0.1", "--port", "0"] + args.server_args
    log = open(args.server_log, "w")
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    addr = None
    deadline = time.time() + 600
    # Read stderr until the address, then keep copying it to the log in a thread.
    while time.time() < deadline:
        line = proc.stderr.readline().decode("utf-8", "replace")
        if not line:
            raise RuntimeError("server exited before printing its address")
        log.write(line)
        m = re.match(r"listening on http://([0-9.]+):([0-9]+)", line)
        if m:
            addr = (m.group(1), int(m.group(2)))
            break
    if addr is None:
        raise RuntimeError("server printed no address")
    lines = {"backend": ""}

    def copy():
        for raw in proc.stderr:
            s = raw.decode("utf-8", "replace")
            if "backend=" in s and not lines["backend"]:
                lines["backend"] = s.strip()
            log.write(s)
        log.close()

    threading.Thread(target=copy, daemon=True).start()
    while time.time() < deadline:
        try:
            status, _ = get(addr, "/health", timeout=2)
            if status == 200:
                break
        except OSError:
            pass
        if proc.poll() is not None:
            raise RuntimeError("server exited while loading")
        time.sleep(0.2)
    else:
        raise RuntimeError("server not healthy in time")
    return proc, addr, lines


def cpu_line():
    model, flags = "unknown", []
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model == "unknown":
                    model = line.split(":", 1)[1].strip()
                if line.startswith("flags") and not flags:
                    have = set(line.split(":", 1)[1].split())
                    wanted = ["avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni",
                              "avx512_bf16", "amx_tile", "amx_int8"]
                    flags = [w for w in wanted if w in have]
    except OSError:
        pass
    return model, flags, os.cpu_count()


def commit():
    try:
        head = subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True).strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"]).returncode != 0
        return head + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def unaccounted(sample):
    """RSS less what the prefix cache says it holds in memory."""
    return sample["rss"] - sample["metrics"].get("ferrite_prefix_cache_memory_bytes", 0)


def judge(samples, args, stats, alive):
    """The verdict and its reasons."""
    reasons = []
    t0, t1 = samples[0]["t"], samples[-1]["t"]
    third = (t1 - t0) / 3
    for name, value in [("RSS", lambda s: s["rss"]), ("RSS less the prefix cache", unaccounted)]:
        second = [value(s) for s in samples if t0 + third <= s["t"] < t0 + 2 * third]
        last = [value(s) for s in samples if s["t"] >= t0 + 2 * third]
        if len(second) < 3 or len(last) < 3:
            reasons.append("too few samples in the second or last third")
            break
        bound = max(second) + args.tolerance_mb * (1 << 20)
        if max(last) > bound:
            reasons.append("%s grew after warm-up: max of last third %.1f MiB > max of second "
                           "third %.1f MiB + %d MiB" % (name, max(last) / 2**20,
                                                        max(second) / 2**20, args.tolerance_mb))
    for s in samples:
        g = s["metrics"]
        mem, budget = g.get("ferrite_prefix_cache_memory_bytes"), g.get(
            "ferrite_prefix_cache_memory_budget_bytes")
        if mem is None or budget is None:
            reasons.append("/metrics lacks the prefix cache gauges")
            break
        if mem > budget:
            reasons.append("prefix cache %d bytes over its budget %d at t=%.0fs" % (
                mem, budget, s["t"] - t0))
            break
        disk, disk_budget = g.get("ferrite_kv_disk_bytes", 0), g.get(
            "ferrite_kv_disk_budget_bytes", 0)
        if disk_budget and disk > disk_budget:
            reasons.append("disk cache %d bytes over its budget %d at t=%.0fs" % (
                disk, disk_budget, s["t"] - t0))
            break
    bad = {k: v for k, v in stats.counts.items()
           if k.startswith("req_status_5") or k in ("req_broken_stream", "req_transport_error")}
    if bad:
        reasons.append("failed requests: %s" % bad)
    if stats.counts.get("req_ok", 0) == 0:
        reasons.append("no request completed")
    if not alive:
        reasons.append("server died")
    return (not reasons), reasons


def mib(x):
    return "%.1f" % (x / 2**20)


def receipt(args, samples, stats, ok, reasons, backend, elapsed, head):
    model, flags, cores = cpu_line()
    t0 = samples[0]["t"]
    third = (samples[-1]["t"] - t0) / 3
    parts = [[s for s in samples if t0 + k * third <= s["t"] < t0 + (k + 1) * third]
             for k in range(3)]
    parts[2] += [s for s in samples if s["t"] >= t0 + 3 * third]
    last = samples[-1]["metrics"]
    out = []
    out.append("# Soak receipt: `ferrite serve` under %d streaming clients (%s)\n" % (
        args.clients, time.strftime("%Y-%m-%d", time.gmtime())))
    out.append("- commit: %s" % head)
    out.append("- command: `scripts/soak.sh %s`" % " ".join(sys.argv[1:]))
    out.append("- server: `ferrite serve %s` (loopback); %s" % (
        " ".join(args.server_args) or "(defaults)", backend.get("backend", "")))
    out.append("- CPU: %s, %s logical cores, flags %s; machine shared with other builds and "
               "tests during the run, so throughput here is not a performance figure" % (
                   model, cores, " ".join(flags)))
    out.append("- load: %d clients, %.0f s (bound %d s or %d requests), mixed prompt lengths "
               "over %d shared prefixes, max_tokens 4-128, chat and completions, temperature 0 "
               "or 0.8, %.0f %% of requests hang up mid-stream, seed %d" % (
                   args.clients, elapsed, args.duration, args.max_requests, len(PREFIX_WORDS),
                   args.disconnect * 100, args.seed))
    out.append("- rule: samples every %g s split into thirds by time (first = warm-up); pass "
               "when max RSS of the last third <= max RSS of the second third + %d MiB, the "
               "same for RSS less the prefix cache's accounted bytes, the memory and disk "
               "caches within their budgets in every sample, no 5xx, broken stream or "
               "transport error, and the server alive at the end" % (
                   args.step, args.tolerance_mb))
    out.append("")
    out.append("| part | samples | RSS min MiB | RSS max MiB | RSS less cache, max MiB | "
               "prefix cache MiB (max) | entries (max) |")
    out.append("|---|---|---|---|---|---|---|")
    for name, part in zip(["warm-up", "second third", "last third"], parts):
        if not part:
            continue
        rss = [s["rss"] for s in part]
        pc = [s["metrics"].get("ferrite_prefix_cache_memory_bytes", 0) for s in part]
        ent = [s["metrics"].get("ferrite_prefix_cache_memory_entries", 0) for s in part]
        out.append("| %s | %d | %s | %s | %s | %s | %d |" % (
            name, len(part), mib(min(rss)), mib(max(rss)),
            mib(max(unaccounted(s) for s in part)), mib(max(pc)), max(ent)))
    out.append("")
    every = max(1, len(samples) // 20)
    out.append("RSS series (MiB, every %d-th sample): %s" % (
        every, " ".join(mib(s["rss"]) for s in samples[::every])))
    out.append("")
    out.append("Prefix cache series (MiB, same samples): %s" % " ".join(
        mib(s["metrics"].get("ferrite_prefix_cache_memory_bytes", 0)) for s in samples[::every]))
    out.append("")
    out.append("Requests: %s" % json.dumps(dict(sorted(stats.counts.items()))))
    keys = ["ferrite_prefix_cache_memory_budget_bytes", "ferrite_kv_disk_bytes",
            "ferrite_kv_disk_budget_bytes", "ferrite_process_resident_bytes",
            "ferrite_generated_tokens_total", "ferrite_cancelled_requests_total",
            "ferrite_cache_hits_total", "ferrite_batched_steps_total"]
    out.append("")
    out.append("Last /metrics: %s" % ", ".join(
        "%s=%g" % (k, last[k]) for k in keys if k in last))
    if stats.errors:
        out.append("")
        out.append("First errors: %s" % "; ".join(str(e) for e in stats.errors[:5]))
    out.append("")
    out.append("**Verdict: %s**%s" % ("PASS" if ok else "FAIL",
                                     "" if ok else " - " + "; ".join(reasons)))
    return "\n".join(out) + "\n"


PREFIX_WORDS = [60, 200, 400, 700]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--binary", default="target/release/ferrite")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--duration", type=int, default=600, help="seconds of load")
    p.add_argument("--max-requests", type=int, default=200000)
    p.add_argument("--disconnect", type=float, default=0.2)
    p.add_argument("--step", type=float, default=5.0, help="seconds between samples")
    p.add_argument("--tolerance-mb", type=int, default=32)
    p.add_argument("--request-timeout", type=float, default=300.0)
    p.add_argument("--seed", type=int, default=35)
    p.add_argument("--receipt", default=None, help="markdown receipt to write")
    p.add_argument("--server-log", default="/tmp/ferrite-soak-server.log")
    p.add_argument("server_args", nargs="*", help="after --: more `ferrite serve` arguments")
    args = p.parse_args()

    head = commit()
    rng = random.Random(args.seed)
    prefixes = [text_of(rng, n) for n in PREFIX_WORDS]
    proc, addr, backend = start_server(args)
    stats = Stats()
    stop = threading.Event()
    threads = [threading.Thread(target=client, args=(addr, args.seed * 1000 + i, prefixes, args,
                                                      stop, stats), daemon=True)
               for i in range(args.clients)]
    start = time.time()
    for t in threads:
        t.start()
    samples = []
    alive = True
    while not stop.is_set() and time.time() - start < args.duration:
        time.sleep(args.step)
        if proc.poll() is not None:
            alive = False
            break
        try:
            _, text = get(addr, "/metrics")
            samples.append({"t": time.time(), "rss": rss_bytes(proc.pid), "metrics": gauges(text)})
        except (OSError, RuntimeError) as e:
            stats.add("metrics_error", repr(e))
        s = samples[-1] if samples else None
        if s:
            print("t=%4.0fs rss=%s MiB prefix=%s MiB entries=%d queue=%d reqs=%s" % (
                s["t"] - start, mib(s["rss"]),
                mib(s["metrics"].get("ferrite_prefix_cache_memory_bytes", 0)),
                s["metrics"].get("ferrite_prefix_cache_memory_entries", 0),
                s["metrics"].get("ferrite_queue_depth", 0), stats.total()), flush=True)
    stop.set()
    elapsed = time.time() - start
    alive = alive and proc.poll() is None
    # Stop the server first: clients waiting in its queue then end at once, so the run
    # ends in bounded time; their cut-off requests are not counted.
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    for t in threads:
        t.join(timeout=5)
    if not samples:
        print("no samples taken", file=sys.stderr)
        return 1
    ok, reasons = judge(samples, args, stats, alive)
    text = receipt(args, samples, stats, ok, reasons, backend, elapsed, head)
    print(text)
    if args.receipt:
        with open(args.receipt, "w") as f:
            f.write(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
