#!/usr/bin/env python3
"""TTFT added by `pagoda router` at 256 concurrent streams (issue 37: at most
1 ms at p50). Two replica stand-ins (tests/router/sse_upstream.py, asyncio:
the first event leaves as soon as the request is read) hold 256 background
streams open (half per replica; with --tick > 0 each sends an SSE comment every
tick s); meanwhile --probes streamed requests, one after another on new connections,
time their connect-to-first-body-byte. The same is done directly against the
stand-ins and through the router, the two fronts taking turns in interleaved
rounds (order alternating); per round the p50 of the probes; reported: each
front's per-round p50s, and the median over rounds of (router - direct).

The client, the stand-ins and the router share the machine: name the processor
and the load beside any figure. With --tick > 0 the one Python process serving
and reading the ticks dominates the direct baseline (Zen 1, load 21: direct p50
87 ms against 1.6 ms through the router at --tick 0.25), so the default is 0.

Usage: bench/router_ttft.py [--pagoda build/release/src/cli/pagoda] [-c 256] [--probes 50]
                            [--rounds 5] [--tick 0]
"""
import argparse
import asyncio
import os
import resource
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "server"))
sys.path.insert(0, os.path.join(ROOT, "tests", "router"))
from serverutil import PagodaServer  # noqa: E402
from sse_upstream import SseUpstream, parse_sse, stream_request  # noqa: E402


async def probe(port, prompt):
    t0 = time.perf_counter()
    first = []
    status, body = await stream_request(port, prompt, on_first=lambda: first.append(time.perf_counter()))
    if status != 200 or not parse_sse(body)[1] or not first:
        raise RuntimeError("probe %s failed: %d %r" % (prompt, status, body[:200]))
    return (first[0] - t0) * 1e3


async def one_round(ups, ports, args, tag):
    release = asyncio.Event()
    for u in ups:
        u.release = release
    opened = [0]

    def on_open():
        opened[0] += 1
    for u in ups:
        u.on_open = on_open
    bg = [asyncio.ensure_future(stream_request(ports[i % len(ports)], "bg-%s-%d" % (tag, i)))
          for i in range(args.c)]
    deadline = time.time() + 60
    while opened[0] < args.c and time.time() < deadline:
        await asyncio.sleep(0.01)
    if opened[0] < args.c:
        raise RuntimeError("only %d of %d background streams opened" % (opened[0], args.c))
    ttft = [await probe(ports[i % len(ports)], "probe-%s-%d" % (tag, i)) for i in range(args.probes)]
    release.set()
    for status, body in await asyncio.gather(*bg):
        if status != 200 or not parse_sse(body)[1]:
            raise RuntimeError("a background stream failed: %d" % status)
    return statistics.median(ttft)


async def main(args):
    ups = [await SseUpstream(n, 3, hold_prefix="bg-", tick=args.tick).start() for n in ("A", "B")]
    extra = []
    for u in ups:
        extra += ["--replica", u.url]
    router = PagodaServer(args.pagoda, "none", extra, command="router")
    await asyncio.get_running_loop().run_in_executor(None, router.__enter__)
    try:
        fronts = {"direct": [u.port for u in ups], "router": [router.port]}
        p50 = {name: [] for name in fronts}
        for r in range(args.rounds + 1):  # round 0 warms up (connections, caches) and is dropped
            order = list(fronts) if r % 2 == 0 else list(reversed(list(fronts)))
            for name in order:
                v = await one_round(ups, fronts[name], args, "r%d-%s" % (r, name))
                if r > 0:
                    p50[name].append(v)
        for name in fronts:
            print("%-7s probe TTFT p50 per round (ms): %s  median %.3f" %
                  (name, " ".join("%.3f" % v for v in p50[name]), statistics.median(p50[name])))
        added = [a - b for a, b in zip(p50["router"], p50["direct"])]
        print("added by the router beside %d concurrent streams: p50 %.3f ms (median of %d interleaved rounds; "
              "per round %s)" % (args.c, statistics.median(added), args.rounds, " ".join("%.3f" % v for v in added)))
    finally:
        router.__exit__(None, None, None)
        for u in ups:
            await u.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pagoda", default=os.path.join(ROOT, "build/release/src/cli/pagoda"))
    ap.add_argument("-c", type=int, default=256)
    ap.add_argument("--probes", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tick", type=float, default=0)
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < 4 * a.c + 256:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4 * a.c + 256), hard))
    asyncio.run(main(a))
