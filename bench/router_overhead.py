#!/usr/bin/env python3
"""What `pagoda router` itself costs per request: one `pagoda serve` of stories260K
(tests/data; a request of a few tokens and max_tokens 1 takes well under a millisecond
of model time) answered directly and through two routers, one with keep-alive upstream
connections (the default, --upstream-keepalive 16) and one opening a connection per
request (--upstream-keepalive 0, what the router did before). C client threads, each
with its own keep-alive connection to the front, send N requests in all; requests/s per
front, 3 interleaved rounds (the fronts take turns, order rotating), medians.

Usage: bench/router_overhead.py [--pagoda build/release/src/cli/pagoda] [-n 2000] [-c 8] [--rounds 3]
"""
import argparse
import http.client
import json
import os
import statistics
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "server"))
from serverutil import PagodaServer  # noqa: E402


def drive(port, n, c):
    """requests/s of n non-streamed completions over c keep-alive client connections."""
    per = [n // c + (1 if i < n % c else 0) for i in range(c)]
    bad = []

    def worker(k):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        for i in range(per[k]):
            body = json.dumps({"prompt": [1, 3 + (k * 7 + i) % 200, 5], "max_tokens": 1, "temperature": 0})
            conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            r = conn.getresponse()
            r.read()
            if r.status != 200:
                bad.append(r.status)
        conn.close()
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(c)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    dt = time.perf_counter() - t0
    if bad:
        raise RuntimeError(f"{len(bad)} requests failed: {bad[:5]}")
    return n / dt


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pagoda", default=os.path.join(ROOT, "build/release/src/cli/pagoda"))
    ap.add_argument("-n", type=int, default=2000)
    ap.add_argument("-c", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    model = os.path.join(ROOT, "tests", "data", "stories260K.gguf")
    with PagodaServer(args.pagoda, model, ["-t", "1"]) as rep:
        fronts = {
            "direct": rep,
            "router keep-alive": PagodaServer(args.pagoda, "none", ["--replica", rep.url], command="router"),
            "router no keep-alive": PagodaServer(args.pagoda, "none", ["--replica", rep.url, "--upstream-keepalive",
                                                                      "0"], command="router"),
        }
        for name, f in fronts.items():
            if f is not rep:
                f.__enter__()
        try:
            names = list(fronts)
            drive(rep.port, 200, args.c)  # warm-up
            res = {k: [] for k in names}
            for rnd in range(args.rounds):
                order = names[rnd % len(names):] + names[:rnd % len(names)]
                for name in order:
                    rps = drive(fronts[name].port, args.n, args.c)
                    res[name].append(rps)
                    print(f"round {rnd + 1}: {name}: {rps:.0f} requests/s", flush=True)
            for name in names:
                print(f"median {name}: {statistics.median(res[name]):.0f} requests/s "
                      f"(rounds {', '.join('%.0f' % x for x in res[name])})")
            m = fronts["router keep-alive"].metrics()
            opened = sum(v for k, v in m.items() if k.startswith("pagoda:router_upstream_connections_total")
                         and 'kind="opened"' in k)
            reused = sum(v for k, v in m.items() if k.startswith("pagoda:router_upstream_connections_total")
                         and 'kind="reused"' in k)
            print(f"router keep-alive: {opened:.0f} upstream connections opened, {reused:.0f} calls on a kept one")
        finally:
            for f in fronts.values():
                if f is not rep:
                    f.__exit__(None, None, None)


if __name__ == "__main__":
    main()
