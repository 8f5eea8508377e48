#!/usr/bin/env python3
"""KV tiers (issue 16) done-when demonstrations against real `pagoda serve` processes.

  restart   a disk tier: 16 requests sharing a 2,048-token prefix, a restart, the
            same 16 again: the first after the restart reports its cached tokens,
            its TTFT against the cold first one, outputs compared bitwise (text
            and token logprobs-free greedy text).
  redis     two replicas on one Redis: a prompt served by A, then by B.
  cluster   the same on a 3-node Redis Cluster, then one node killed while both
            replicas serve 16 requests: every request must end 200, no 5xx.
  fsync     the cost of crash-safe disk writes (--kv-disk-fsync on vs off) on the
            restart workload's cold half: wall time of the 16 requests, and of the
            16 requests plus the server's exit (which drains every store), medians
            of 3 interleaved rounds; then the restart's first request from that disk.

Usage: bench/tiers_bench.py [--pagoda build/release/src/cli/pagoda] [--model M]
                            [--scenarios restart,redis,cluster,fsync] [-t 2] [--disk-root DIR]
Prints one line per measurement and a summary; exits 1 when a done-when bound fails.
"""
import argparse
import http.client
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "server"))
from serverutil import PagodaServer  # noqa: E402

PREFIX_TOKENS = 2048


def prompts(n, prefix_len, suffix_len, seed):
    rng = random.Random(seed)
    prefix = [rng.randrange(200, 30000) for _ in range(prefix_len)]
    return [prefix + [rng.randrange(200, 30000) for _ in range(suffix_len)] for _ in range(n)]


def stream_completion(port, prompt, max_tokens=16):
    """(ttft seconds, text, cached tokens, http status) of one streaming greedy completion."""
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        return None, "", 0, r.status
    ttft, text, cached = None, "", 0
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if ev.get("error"):
            return ttft, text, cached, 500
        for ch in ev.get("choices", []):
            if ttft is None:
                ttft = time.perf_counter() - t0
            text += ch.get("text", "")
        if ev.get("usage"):
            cached = ev["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
    c.close()
    return ttft, text, cached, 200


def free_port(pair=False):
    while True:
        p = random.randrange(20000, 50000) if pair else 0
        ok = True
        for q in ([p, p + 10000] if pair else [p]):
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", q))
                if not pair:
                    p = s.getsockname()[1]
            except OSError:
                ok = False
            s.close()
        if ok:
            return p


class Redis:
    def __init__(self, d, cluster=False):
        self.port = free_port(pair=cluster)
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", d, "--loglevel", "warning", "--maxmemory", "2gb", "--maxmemory-policy", "allkeys-lru"]
        if cluster:
            args += ["--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{self.port}.conf"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(200):
            if subprocess.run(["redis-cli", "-p", str(self.port), "ping"], capture_output=True, text=True).stdout.strip() == "PONG":
                return
            time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def kill(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait()


def serve(args, extra):
    return PagodaServer(args.pagoda, args.model, ["-t", str(args.threads), "--kv-cache-memory", "512MiB"] + extra,
                        timeout=300)


def check(ok, what, failures):
    print(("PASS " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def scenario_restart(args, failures):
    d = tempfile.mkdtemp(prefix="pagoda-tiers-disk-")
    try:
        ps = prompts(16, PREFIX_TOKENS, 32, seed=1)
        flags = ["--kv-disk-dir", d, "--kv-disk-size", "4GiB"]
        with serve(args, flags) as s:
            cold = [stream_completion(s.port, p) for p in ps]
        time.sleep(1)
        with serve(args, flags) as s:
            warm = [stream_completion(s.port, p) for p in ps]
            m = s.metrics()
        cold_ttft, warm_ttft = cold[0][0], warm[0][0]
        disk_hits = m.get('pagoda:kv_tier_hit_tokens_total{tier="disk"}', 0)
        disk_read = m.get('pagoda:kv_tier_bytes_read_total{tier="disk"}', 0)
        print(f"restart: cold first TTFT {cold_ttft:.3f} s, cached {cold[0][2]}; after restart first TTFT "
              f"{warm_ttft:.3f} s, cached {warm[0][2]} of {len(ps[0])} prompt tokens; ratio {warm_ttft / cold_ttft:.3f}; "
              f"disk tier hits {disk_hits:.0f} tokens, bytes read {disk_read:.0f}", flush=True)
        check(warm[0][2] >= 2000, f"restart: first request after restart has {warm[0][2]} >= 2000 cached tokens", failures)
        check(warm_ttft <= 0.3 * cold_ttft, f"restart: TTFT {warm_ttft:.3f} <= 0.3 x cold {cold_ttft:.3f}", failures)
        same = sum(1 for a, b in zip(cold, warm) if a[1] == b[1] and a[3] == b[3] == 200)
        check(same == len(ps), f"restart: {same}/{len(ps)} outputs identical to the cold run", failures)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def scenario_fsync(args, failures):
    ps = prompts(16, PREFIX_TOKENS, 32, seed=5)
    times = {"on": [], "off": []}
    for rnd in range(3):
        for mode in (["on", "off"] if rnd % 2 == 0 else ["off", "on"]):
            d = tempfile.mkdtemp(prefix="pagoda-tiers-fsync-", dir=args.disk_root)
            try:
                flags = ["--kv-disk-dir", d, "--kv-disk-size", "4GiB", "--kv-disk-fsync", mode]
                s = serve(args, flags).__enter__()
                t0 = time.perf_counter()
                cold = [stream_completion(s.port, p) for p in ps]
                t1 = time.perf_counter()
                stores = s.metrics().get('pagoda:kv_tier_stores_total{tier="disk"}', 0)
                s.__exit__(None, None, None)  # SIGTERM; the engine's end drains the stores
                t2 = time.perf_counter()
                files = len([f for f in os.listdir(d) if not f.startswith(".")])
                with serve(args, flags) as w:
                    warm = stream_completion(w.port, ps[0])
                times[mode].append((t1 - t0, t2 - t0))
                print(f"fsync {mode} round {rnd}: 16 requests {t1 - t0:.2f} s, with drain and exit {t2 - t0:.2f} s, "
                      f"stores {stores:.0f}, files {files}; "
                      f"restart: cached {warm[2]}, same text {warm[1] == cold[0][1]}", flush=True)
                check(warm[2] >= 2000 and warm[1] == cold[0][1] and all(c[3] == 200 for c in cold),
                      f"fsync {mode}: the restart after it is served from disk, same output", failures)
            finally:
                shutil.rmtree(d, ignore_errors=True)
    med = {k: (statistics.median(a for a, _ in v), statistics.median(b for _, b in v)) for k, v in times.items()}
    print(f"fsync: median 16 requests on {med['on'][0]:.2f} s / off {med['off'][0]:.2f} s "
          f"(ratio {med['on'][0] / med['off'][0]:.3f}); with drain and exit on {med['on'][1]:.2f} s / "
          f"off {med['off'][1]:.2f} s (ratio {med['on'][1] / med['off'][1]:.3f})", flush=True)


def two_replicas(args, url, label, failures, rounds=3, after=None):
    # Each round its own 2,048-token prefix: A computes it cold, then B asks for it.
    base = {"redis": 200, "cluster": 300}[label]
    ps = [prompts(1, PREFIX_TOKENS, 32, seed=base + i)[0] for i in range(rounds)]
    flags = ["--kv-redis", url]
    with serve(args, flags) as a, serve(args, flags) as b:
        ratios, fracs, same = [], [], 0
        for p in ps:
            ta, text_a, ca, _ = stream_completion(a.port, p)
            time.sleep(0.5)  # A's write-through reaches Redis
            tb, text_b, cb, _ = stream_completion(b.port, p)
            ratios.append(tb / ta)
            fracs.append(cb / len(p))
            same += text_a == text_b
            print(f"{label}: A cold TTFT {ta:.3f} s (cached {ca}); B TTFT {tb:.3f} s, cached {cb}/{len(p)} "
                  f"({100 * cb / len(p):.1f}%), ratio {tb / ta:.3f}", flush=True)
        r, f = statistics.median(ratios), min(fracs)
        check(f >= 0.9, f"{label}: replica B has >= 90% of the prompt cached (min {100 * f:.1f}%)", failures)
        check(r <= 0.4, f"{label}: replica B TTFT median ratio {r:.3f} <= 0.4 x cold", failures)
        check(same == len(ps), f"{label}: {same}/{len(ps)} outputs of B identical to A's", failures)
        if after:
            after(a, b)


def scenario_redis(args, failures):
    d = tempfile.mkdtemp(prefix="pagoda-tiers-redis-")
    r = Redis(d)
    try:
        two_replicas(args, f"redis://127.0.0.1:{r.port}", "redis", failures)
    finally:
        r.stop()
        shutil.rmtree(d, ignore_errors=True)


def scenario_cluster(args, failures):
    d = tempfile.mkdtemp(prefix="pagoda-tiers-cluster-")
    nodes = [Redis(d, cluster=True) for _ in range(3)]
    try:
        subprocess.run(["redis-cli", "--cluster", "create"] + [f"127.0.0.1:{n.port}" for n in nodes] +
                       ["--cluster-replicas", "0", "--cluster-yes"], check=True, capture_output=True)
        for _ in range(200):
            if all("cluster_state:ok" in subprocess.run(["redis-cli", "-p", str(n.port), "cluster", "info"],
                                                        capture_output=True, text=True).stdout for n in nodes):
                break
            time.sleep(0.05)
        url = "redis://" + ",".join(f"127.0.0.1:{n.port}" for n in nodes)

        def kill_mid_run(a, b):
            ps = prompts(16, 512, 16, seed=77)
            results = [None] * len(ps)

            def one(i):
                results[i] = stream_completion((a if i % 2 == 0 else b).port, ps[i], max_tokens=8)
            threads = [threading.Thread(target=one, args=(i,)) for i in range(len(ps))]
            for t in threads:
                t.start()
            time.sleep(1.0)
            nodes[1].kill()
            for t in threads:
                t.join()
            statuses = [r[3] for r in results]
            ok = sum(1 for s in statuses if s == 200)
            key = 'pagoda:kv_tier_errors_total{tier="redis"}'
            errors = sum(m.get(key, 0) for m in (a.metrics(), b.metrics()))
            fives = sum(1 for s in statuses if s >= 500)
            print(f"cluster kill: {ok}/{len(ps)} requests 200, {fives} 5xx, redis tier errors counted {errors:.0f}",
                  flush=True)
            check(ok == len(ps) and fives == 0, "cluster: node killed mid-run, every request 200, no 5xx", failures)

        two_replicas(args, url, "cluster", failures, after=kill_mid_run)
    finally:
        for n in nodes:
            n.stop()
        shutil.rmtree(d, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pagoda", default=os.path.join(ROOT, "build/release/src/cli/pagoda"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--scenarios", default="restart,redis,cluster")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--disk-root", default=None, help="where the fsync scenario's disk tiers live (default $TMPDIR)")
    args = ap.parse_args()
    failures = []
    for name in args.scenarios.split(","):
        {"restart": scenario_restart, "redis": scenario_redis, "cluster": scenario_cluster,
         "fsync": scenario_fsync}[name](args, failures)
    print("summary: " + ("all done-when bounds met" if not failures else f"{len(failures)} failed: {failures}"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
