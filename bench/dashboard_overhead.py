#!/usr/bin/env python3
"""The live dashboard's cost to serving throughput (issue 20: under 2% at 10 Hz).

One `pagoda serve`; many short rounds of the same fixed workload (`pagoda bench
--server`, random token ids, fixed seed), each round running it twice: A with
nobody watching, B with a client subscribed to /dashboard/events?hz=10 reading
every event. The order alternates (AB, BA, AB, ...) so a change in the machine's
load falls on both. Per round the overhead is 1 - B/A of output tokens/s; the
result is the median over the rounds and its interquartile range, so that a few
rounds disturbed by other work on a shared machine do not decide it.

Second line, the direct cost: the engine-thread time spent taking the snapshots
(the event's snapshot_us, summed over a B run) as a share of that run's wall
time, and the same for the hub thread's encoding (encode_us; another thread, so
it slows the engine only where cores are short). Third line: the server's CPU
time per output token, B against A.

usage: dashboard_overhead.py PAGODA MODEL [ROUNDS]
environment: THREADS (2), NUM_PROMPTS (16), INPUT_LEN (64), OUTPUT_LEN (32),
CONCURRENCY (8), HZ (10)
"""
import http.client
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import threading
import time

PAGODA, MODEL = sys.argv[1], sys.argv[2]
ROUNDS = int(sys.argv[3]) if len(sys.argv) > 3 else 20
THREADS = os.environ.get("THREADS", "2")
HZ = int(os.environ.get("HZ", "10"))
WORK = ["--workload", "random", "--num-prompts", os.environ.get("NUM_PROMPTS", "16"),
        "--input-len", os.environ.get("INPUT_LEN", "64"), "--output-len", os.environ.get("OUTPUT_LEN", "32"),
        "--max-concurrency", os.environ.get("CONCURRENCY", "8"), "--seed", "1", "--json", "--disable-tqdm"]


def start_server():
    proc = subprocess.Popen([PAGODA, "serve", "-m", MODEL, "--port", "0", "-t", THREADS, "--log-stats-interval", "0",
                             "--disable-log-requests"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    for line in proc.stderr:
        m = re.search(r"listening on http://[^:]+:(\d+)", line)
        if m:
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()  # keep draining
            return proc, int(m.group(1))
        if time.time() > deadline:
            break
    proc.kill()
    sys.exit("pagoda serve did not start")


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


class Watcher:
    """A dashboard client: reads every SSE event (the snapshot_us field only, no JSON
    parse of the whole event) until stop()."""

    def __init__(self, port):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.conn.request("GET", f"/dashboard/events?hz={HZ}")
        self.resp = self.conn.getresponse()
        assert self.resp.status == 200, self.resp.status
        self.events, self.snapshot_us, self.encode_us = 0, 0.0, 0.0
        self.t0 = time.monotonic()
        self.thread = threading.Thread(target=self.read, daemon=True)
        self.thread.start()

    def read(self):
        try:
            while True:
                line = self.resp.readline()
                if not line:
                    return
                if line.startswith(b"data: "):
                    self.events += 1
                    m = re.search(rb'"snapshot_us":(\d+),"encode_us":(\d+)', line)
                    if m:
                        self.snapshot_us += int(m.group(1))
                        self.encode_us += int(m.group(2))
        except (OSError, http.client.HTTPException, ValueError):
            return

    def stop(self):
        self.wall = time.monotonic() - self.t0
        try:
            self.conn.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.thread.join(timeout=5)
        self.conn.close()


def run(server, port, watched):
    """One run of the workload: (output tokens/s, server CPU s per output token, watcher or None)."""
    w = Watcher(port) if watched else None
    if w:
        time.sleep(0.3)  # subscribed and receiving before the workload starts
    c0 = cpu_seconds(server.pid)
    p = subprocess.run([PAGODA, "bench", "-m", MODEL, "--server", f"http://127.0.0.1:{port}", *WORK],
                       capture_output=True, text=True, timeout=600)
    c1 = cpu_seconds(server.pid)
    if w:
        w.stop()
    if p.returncode != 0:
        sys.exit("pagoda bench failed:\n" + p.stderr)
    j = json.loads(p.stdout)
    if j["failed"]:
        sys.exit(f"{j['failed']} requests failed: {j.get('first_error')}")
    return j["output_tokens_per_s"], (c1 - c0) / j["total_output_tokens"], w


def quartiles(v):
    q = statistics.quantiles(v, n=4, method="inclusive") if len(v) > 1 else [v[0]] * 3
    return q[0], statistics.median(v), q[2]


def main():
    server, port = start_server()
    try:
        run(server, port, False)  # warm-up: pages in the weights, fills the allocator
        overhead, cpu_overhead, direct, encode, rates = [], [], [], [], []
        for r in range(ROUNDS):
            res = {}
            for watched in ((False, True) if r % 2 == 0 else (True, False)):
                res[watched] = run(server, port, watched)
            (ta, ca, _), (tb, cb, w) = res[False], res[True]
            overhead.append(100 * (1 - tb / ta))
            cpu_overhead.append(100 * (cb / ca - 1))
            direct.append(100 * w.snapshot_us / 1e6 / w.wall)
            encode.append(100 * w.encode_us / 1e6 / w.wall)
            rates.append(w.events / w.wall)
            load = open("/proc/loadavg").read().split()[0]
            print(f"round {r + 1:2d} (load {load}): none {ta:8.2f} tok/s, dashboard@{HZ}Hz {tb:8.2f} tok/s: "
                  f"overhead {overhead[-1]:+6.2f}%; server CPU/token {cpu_overhead[-1]:+6.2f}%; {w.events} events, "
                  f"snapshots {w.snapshot_us / max(1, w.events):.0f} us each", flush=True)
        q1, med, q3 = quartiles(overhead)
        print(f"dashboard overhead: median {med:.2f}% (IQR {q1:.2f}..{q3:.2f}) over {ROUNDS} rounds")
        d1, dmed, d3 = quartiles(direct)
        print(f"dashboard direct cost: engine thread in snapshots median {dmed:.3f}% of wall time "
              f"(IQR {d1:.3f}..{d3:.3f}) at {statistics.median(rates):.1f} events/s; the hub thread encoding "
              f"them {statistics.median(encode):.3f}% of one core")
        c1_, cmed, c3 = quartiles(cpu_overhead)
        print(f"server CPU per output token: median {cmed:+.2f}% (IQR {c1_:+.2f}..{c3:+.2f}) with the dashboard")
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
