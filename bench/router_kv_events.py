#!/usr/bin/env python3
"""Event routing against the hash ring (issue 37): 4 replicas of `pagoda serve` on
the default model with small KV pools, each publishing its KV events
(--kv-events-config), behind `pagoda router --kv-events` or the plain prefix router
(the ring). The workload: 64 shared prefixes (token-id prompts of --prefix-blocks
whole blocks) and a short distinct suffix per request; popularity is a Zipf law
over the prefixes whose order rotates --phases times during the run, so the hot
prefixes move. The same seeded request sequence goes through both routers, with
fresh replicas for each run; rounds interleave the two (order alternating).

Reported per router, medians of --rounds: the prefix hit rate (the replicas' own
/metrics: prefix_cache_hits_total / prefix_cache_queries_total, in tokens) and
requests/s. The issue's bar: event routing at least 15 points of hit rate and 1.3x
the throughput of the ring.

Needs the engine's KV event publisher (issue 37, part 1): without it the replicas
refuse --kv-events-config and this script says so and exits 2 (--ring-only runs
the ring alone, replicas without events: a check of the script, no comparison).

--shared-head N puts one of --heads (4) N-block system prompts before every
prefix (prefix k gets head k mod 4): with N >= the router's --affinity-blocks (8)
the ring's key is the head alone, so the ring sends every prompt of a head to one
replica (spilling past the load bound), while the events see the whole match.
--kv-min-match N is passed to the event router; --max-imbalance F to both routers
(their load bound; the event router's holders have their own, --kv-max-imbalance,
default 2). Issue 37's figures: `--shared-head 8 --heads 1 --rounds 3`
(docs/router_kv_events.md); bench/router_kv_oracle.py shows what a
perfect index could gain on the same sequences.

Usage: bench/router_kv_events.py [--pagoda build/release/src/cli/pagoda] [--model GGUF]
       [--replicas 4] [--prefixes 64] [--requests 512] [-c 8] [--rounds 3]
       [--num-kv-blocks 160] [--prefix-blocks 16] [--phases 4] [--ring-only]
       [--shared-head 0] [--heads 4] [--kv-min-match 1] [--max-imbalance 0.5]
"""
import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "server"))
from serverutil import PagodaServer  # noqa: E402
from serve_load import counter_sum, scrape  # noqa: E402

BS = 16


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def add_workload_args(ap):
    """The workload's flags (also bench/router_kv_oracle.py's)."""
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--prefixes", type=int, default=64)
    ap.add_argument("--prefix-blocks", type=int, default=16)
    ap.add_argument("--requests", type=int, default=512)
    ap.add_argument("--phases", type=int, default=4)
    ap.add_argument("--num-kv-blocks", type=int, default=160)
    ap.add_argument("--shared-head", type=int, default=0, help="blocks of a shared system prompt before each prefix")
    ap.add_argument("--heads", type=int, default=4, help="distinct shared heads (with --shared-head)")


def workload(args):
    """The request sequence: (prefix index, token ids), the same for every run."""
    rng = random.Random(1234)
    prefixes = [[rng.randrange(300, 40000) for _ in range(args.prefix_blocks * BS)] for _ in range(args.prefixes)]
    if args.shared_head:
        heads = [[rng.randrange(300, 40000) for _ in range(args.shared_head * BS)] for _ in range(args.heads)]
        prefixes = [heads[k % args.heads] + p for k, p in enumerate(prefixes)]
    weights = [1.0 / (i + 1) ** 1.1 for i in range(args.prefixes)]
    per_phase = args.requests // args.phases
    out = []
    for p in range(args.phases):
        shift = p * args.prefixes // args.phases  # the hot set moves by a quarter each phase
        order = [(i + shift) % args.prefixes for i in range(args.prefixes)]
        for k in rng.choices(range(args.prefixes), weights=weights, k=per_phase):
            out.append(prefixes[order[k]] + [rng.randrange(300, 40000) for _ in range(8)])
    return out


def post(url, body, timeout=300):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read()


def drive(url, prompts, c):
    """requests/s of the prompts (in order, c at a time); raises if one fails."""
    it = iter(enumerate(prompts))
    lock = threading.Lock()
    bad = []

    def worker():
        while True:
            with lock:
                nxt = next(it, None)
            if nxt is None:
                return
            try:
                status, _ = post(url + "/v1/completions", {"prompt": nxt[1], "max_tokens": 4, "temperature": 0})
                if status != 200:
                    bad.append(status)
            except Exception as e:  # noqa: BLE001
                bad.append(str(e))
    threads = [threading.Thread(target=worker) for _ in range(c)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    dt = time.perf_counter() - t0
    if bad:
        raise RuntimeError(f"{len(bad)} requests failed: {bad[:5]}")
    return len(prompts) / dt


def one_run(args, mode, prompts):
    """Fresh replicas and a router of `mode` ("kv" or "ring"); returns (hit rate, requests/s)."""
    reps, eps = [], []
    router = None
    try:
        for _ in range(args.replicas):
            p = free_port()
            q = free_port()
            cfg = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{p}",
                   "replay_endpoint": f"tcp://*:{q}", "topic": "kv-events", "buffer_steps": 10000,
                   "hwm": 100000}
            flags = ["-t", "1", "--num-kv-blocks", str(args.num_kv_blocks), "--block-size", str(BS)]
            if not args.ring_only:
                flags += ["--kv-events-config", json.dumps(cfg)]
            srv = PagodaServer(args.pagoda, args.model, flags)
            try:
                reps.append(srv.__enter__())
            except RuntimeError as e:
                if "kv-events-config" in str(e):
                    print("this benchmark needs the engine's KV event publisher (`pagoda serve "
                          "--kv-events-config`, issue 37 part 1):\n" + str(e)[-400:])
                    sys.exit(2)
                raise
            # The replica binds (vLLM's rule: an endpoint with `*` binds, else connects); the router connects.
            eps.append((f"tcp://127.0.0.1:{p}", f"tcp://127.0.0.1:{q}"))
        flags = []
        for r in reps:
            flags += ["--replica", r.url]
        flags += ["--block-size", str(BS), "--health-interval", "1", "--max-imbalance", str(args.max_imbalance)]
        if mode == "kv":
            flags += ["--kv-events", "--kv-events-endpoint", ",".join(e for e, _ in eps),
                      "--kv-replay-endpoint", ",".join(r for _, r in eps), "--kv-min-match", str(args.kv_min_match)]
        router = PagodaServer(args.pagoda, args.model, flags, command="router").__enter__()
        time.sleep(0.5)  # ZeroMQ subscriptions settle (a missed start-up message is replayed anyway)
        m0 = [r.metrics() for r in reps]
        rps = drive(router.url, prompts, args.c)
        m1 = [r.metrics() for r in reps]
        hits = sum(counter_sum(b, "pagoda:prefix_cache_hits_total") - counter_sum(a, "pagoda:prefix_cache_hits_total")
                   for a, b in zip(m0, m1))
        queries = sum(counter_sum(b, "pagoda:prefix_cache_queries_total") -
                      counter_sum(a, "pagoda:prefix_cache_queries_total") for a, b in zip(m0, m1))
        rm = scrape(router.url)
        kinds = {k.split('"')[1]: v for k, v in rm.items() if k.startswith("pagoda:router_routing_decisions_total{")}
        print(f"  {mode:4s}: hit rate {100 * hits / max(queries, 1):5.1f} %  {rps:6.2f} req/s  decisions {kinds}",
              flush=True)
        return hits / max(queries, 1), rps
    finally:
        for s in ([router] if router else []) + reps:
            s.__exit__(None, None, None)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pagoda", default=os.path.join(ROOT, "build/release/src/cli/pagoda"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    add_workload_args(ap)
    ap.add_argument("-c", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kv-min-match", type=int, default=1, help="the event router's --kv-min-match")
    ap.add_argument("--max-imbalance", type=float, default=0.5, help="both routers' --max-imbalance (their load bound)")
    ap.add_argument("--ring-only", action="store_true",
                    help="run the ring alone (replicas without events): a check of the workload, no comparison")
    args = ap.parse_args()
    prompts = workload(args)
    res = {"kv": [], "ring": []}
    for rnd in range(args.rounds):
        print(f"round {rnd + 1}/{args.rounds}", flush=True)
        for mode in (["ring"] if args.ring_only else ["ring", "kv"] if rnd % 2 == 0 else ["kv", "ring"]):
            res[mode].append(one_run(args, mode, prompts))
    if args.ring_only:
        return
    med = {m: (statistics.median(h for h, _ in v), statistics.median(r for _, r in v)) for m, v in res.items()}
    dpts = 100 * (med["kv"][0] - med["ring"][0])
    ratio = med["kv"][1] / med["ring"][1]
    print(f"medians of {args.rounds}: ring {100 * med['ring'][0]:.1f} % {med['ring'][1]:.2f} req/s; "
          f"kv events {100 * med['kv'][0]:.1f} % {med['kv'][1]:.2f} req/s")
    print(f"kv events - ring: {dpts:+.1f} points of prefix hit rate, {ratio:.2f}x requests/s "
          f"(issue 37's bar: +15 points and 1.3x: {'met' if dpts >= 15 and ratio >= 1.3 else 'NOT met'})")
    print(json.dumps({"ring": med["ring"], "kv": med["kv"], "hit_rate_points": dpts, "throughput_ratio": ratio}))


if __name__ == "__main__":
    main()
