#!/usr/bin/env python3
"""1,000 concurrent streamed requests through `pagoda router` (issue 37): the
router has no thread per request, so its thread count stays bounded while all
1,000 streams are open at once, and every one completes with its own body.

Two replica stand-ins (sse_upstream.py, asyncio) hold each stream after its
first event until all 1,000 are open on them together, so the router provably
relays 1,000 live streams at one moment; meanwhile /proc/<router>/status
Threads is read every 20 ms. The bound: main + 2 HTTP I/O threads + 2 routing
workers + 1 upstream loop + 1 resolver + 1 health thread = 8; the test allows
12 (a library thread more is not a thread per request; 1,000 would be).
Then 200 more requests (50 at a time) run on the kept-alive connections. The
health interval is long (one check at start): a stand-in busy with 2,000 sockets
on a loaded machine may answer /health late, and the spread would then depend on it.

  test_router_concurrency.py PAGODA_BINARY
"""
import asyncio
import os
import resource
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "server"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serverutil import PagodaServer  # noqa: E402
from sse_upstream import SseUpstream, expected_events, parse_sse, stream_request  # noqa: E402

N = 1000
EVENTS = 3
THREAD_BOUND = 12


def skip_or_fail(msg):
    print(msg)
    sys.exit(1 if os.environ.get("CI") == "true" else 77)


def threads_of(pid):
    with open("/proc/%d/status" % pid) as f:
        for ln in f:
            if ln.startswith("Threads:"):
                return int(ln.split()[1])
    return -1


def metric(text, name, labels_has=""):
    total = 0.0
    for ln in text.splitlines():
        if ln.startswith(name) and labels_has in ln:
            total += float(ln.rsplit(" ", 1)[1])
    return total


async def scrape(port):
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    data = await r.read()
    w.close()
    return data.split(b"\r\n\r\n", 1)[1].decode()


async def main(binary):
    release = asyncio.Event()
    ups = []
    most_open = [0]  # streams open on the two replicas together, at most

    def on_open():
        most_open[0] = max(most_open[0], sum(u.open_streams for u in ups))
        if most_open[0] >= N:
            release.set()

    for name in ("A", "B"):
        ups.append(await SseUpstream(name, EVENTS, release, on_open).start())
    args = []
    for u in ups:
        args += ["--replica", u.url]
    router = PagodaServer(binary, "none", args + ["--workers", "2", "--health-interval", "30"], command="router")
    # PagodaServer waits for the "listening" line on a thread: the replicas answer /health meanwhile.
    await asyncio.get_running_loop().run_in_executor(None, router.__enter__)
    try:
        pid = router.proc.pid
        idle_threads = threads_of(pid)
        samples = []
        stop = threading.Event()

        def sampler():
            while not stop.is_set():
                samples.append(threads_of(pid))
                time.sleep(0.02)

        th = threading.Thread(target=sampler, daemon=True)
        th.start()
        t0 = time.time()
        tasks = [asyncio.ensure_future(stream_request(router.port, "p%d" % i)) for i in range(N)]
        try:
            await asyncio.wait_for(release.wait(), 60)
        except asyncio.TimeoutError:
            pass
        at_peak = threads_of(pid)
        open_at_release = most_open[0]
        release.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        elapsed = time.time() - t0
        stop.set()
        th.join()
        failures = []
        per_replica = {"A": 0, "B": 0}
        for i, res in enumerate(results):
            if isinstance(res, Exception):
                failures.append("request %d: %r" % (i, res))
                continue
            status, body = res
            texts, done = parse_sse(body)
            name = texts[0].split("|")[1] if texts else "?"
            if status != 200 or not done or name not in per_replica or texts != expected_events("p%d" % i, name,
                                                                                                 EVENTS):
                failures.append("request %d: status %d, events %r, done %s" % (i, status, texts, done))
                continue
            per_replica[name] += 1
        peak = max(samples + [at_peak])
        print("router threads: idle %d, peak %d during %d concurrent streams (%d open on the replicas at once), "
              "%.1f s; per replica %s" % (idle_threads, peak, N, open_at_release, elapsed, per_replica))
        ok = True
        if failures:
            print("%d of %d requests failed, first: %s" % (len(failures), N, failures[:3]))
            ok = False
        if open_at_release < N:
            print("only %d streams were open on the replicas at once (want %d)" % (open_at_release, N))
            ok = False
        if peak > THREAD_BOUND:
            print("the router ran %d threads (bound %d)" % (peak, THREAD_BOUND))
            ok = False
        if min(per_replica.values()) == 0:
            print("one replica got no request: %s" % per_replica)
            ok = False

        # Keep-alive: a second wave runs (partly) on the connections the first left idle.
        before = metric(await scrape(router.port), "pagoda:router_upstream_connections_total", 'kind="reused"')
        sem = asyncio.Semaphore(50)

        async def one(i):
            async with sem:
                return await stream_request(router.port, "q%d" % i)

        wave = await asyncio.gather(*[one(i) for i in range(200)])
        bad = [i for i, (s, b) in enumerate(wave) if s != 200 or not parse_sse(b)[1]]
        reused = metric(await scrape(router.port), "pagoda:router_upstream_connections_total",
                        'kind="reused"') - before
        print("second wave: 200 requests, %d failed, %d calls on kept-alive connections" % (len(bad), reused))
        if bad or reused <= 0:
            ok = False
        return 0 if ok else 1
    finally:
        router.__exit__(None, None, None)
        for u in ups:
            await u.close()


if __name__ == "__main__":
    if len(sys.argv) < 2 or not os.path.exists(sys.argv[1]):
        skip_or_fail("usage: test_router_concurrency.py PAGODA_BINARY (binary missing)")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 4 * N + 512  # this process: N client + N replica sockets; the router: N + N
    if hard != resource.RLIM_INFINITY and hard < want:
        skip_or_fail("RLIMIT_NOFILE hard limit %d < %d descriptors needed" % (hard, want))
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))  # inherited by the router
    sys.exit(asyncio.run(main(sys.argv[1])))
