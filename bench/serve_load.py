#!/usr/bin/env python3
"""HTTP load test for `pagoda serve` (issue #6).

Fires N concurrent streaming /v1/completions and /v1/chat/completions requests
with mixed prompt lengths and max_tokens (all seeded), `ignore_eos` so every
output length is exact; a fraction of the clients close their socket after a
few chunks (or right after the response headers, while the request may still
be queued). Checks:

  - every request that was not dropped: HTTP 200, no error event, `data: [DONE]`,
    exactly max_tokens content chunks, usage.completion_tokens == max_tokens,
    usage.prompt_tokens == the /tokenize count, finish_reason "length", and (when
    the server returns them) exactly max_tokens `token_ids`;
  - no 5xx anywhere (responses and the server's request_failure_total);
  - every dropped stream is aborted by the server (request_success_total{abort});
  - /health answers 200 within --health-max-s all through the load;
  - after the drain /metrics reaches 0 running, 0 waiting and 0 KV usage (no
    block in use: all free or cached) within --drain-timeout.

Exit status 0 when every check holds, 1 with one line per violation otherwise.

  bench/serve_load.py --binary build/src/cli/pagoda            # start a server (SmolLM2)
  bench/serve_load.py --url http://127.0.0.1:8080              # attach to a running one
  bench/serve_load.py --binary ... --clients 24 --max-tokens 8:32 --prompt-words 8:48   # the CI size

The run is one asyncio loop with raw HTTP/1.1 over TCP, so a drop is a real
socket close; /health and /metrics are polled from a thread of their own.
"""
import argparse
import asyncio
import json
import os
import random
import re
import socket
import struct
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "server"))
from serverutil import PagodaServer  # noqa: E402

DEFAULT_MODEL = os.path.join(REPO, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")

WORDS = ("the a little cat dog bird tree river house garden morning night sun moon star cloud rain wind "
         "road city village friend mother father child teacher book story song game ball box door window "
         "table chair bread apple water fire stone mountain forest ocean ship train car bike happy sad "
         "quick slow bright dark warm cold green blue red yellow old new big small walked ran jumped sang "
         "looked found gave took made saw heard said thought wanted liked played read wrote built opened "
         "closed and but then so because when while after before under over near far with without").split()
SYSTEM_PROMPT = ("You are a careful, friendly assistant. Answer briefly and clearly, and say when you are "
                 "not sure. ") * 3


@dataclass
class LoadConfig:
    clients: int = 128
    seed: int = 0
    drop_fraction: float = 0.2      # share of clients that close their socket mid-stream
    chat_fraction: float = 0.5      # share of /v1/chat/completions (the rest /v1/completions)
    max_tokens: tuple = (16, 128)   # inclusive range for clients that read to the end
    drop_max_tokens: int = 256      # dropped clients ask for this many (they leave long before)
    drop_after: tuple = (0, 4)      # chunks read before the drop (0: right after the headers)
    prompt_words: tuple = (8, 200)  # inclusive range of prompt words
    shared_prefix_fraction: float = 0.3  # share whose prompt starts with a common prefix
    request_timeout: float = 1800.0
    health_interval: float = 0.25
    health_max_s: float = 2.0
    drain_timeout: float = 60.0
    verbose: bool = False


@dataclass
class Spec:
    idx: int
    endpoint: str                   # "completions" | "chat"
    body: dict
    max_tokens: int
    drop_after: int = -1            # >= 0: close the socket after this many content chunks
    drop_reset: bool = False        # drop with a TCP reset (SO_LINGER 0) instead of an orderly FIN
    prompt_tokens: int = -1         # expected usage.prompt_tokens (-1: unknown)


@dataclass
class Result:
    spec: Spec
    status: int = 0
    chunks: int = 0                 # SSE events that carry a choice
    token_ids: int = 0
    saw_token_ids: bool = False
    usage: dict = None
    finish_reason: str = None
    done: bool = False              # saw data: [DONE]
    dropped: bool = False
    role_ok: bool = True
    error: str = ""
    body: str = ""
    t_start: float = 0.0
    t_first: float = 0.0
    t_end: float = 0.0


@dataclass
class Report:
    results: list = field(default_factory=list)
    violations: list = field(default_factory=list)
    duration_s: float = 0.0
    health: list = field(default_factory=list)          # (ok, seconds)
    metrics_before: dict = field(default_factory=dict)
    metrics_after: dict = field(default_factory=dict)
    peaks: dict = field(default_factory=dict)
    drain_s: float = 0.0

    @property
    def completed(self):
        return [r for r in self.results if r.spec.drop_after < 0]

    @property
    def dropped(self):
        return [r for r in self.results if r.spec.drop_after >= 0]


# ---- plain HTTP helpers (blocking; used outside the load loop) -------------------

def http_json(url, path, body=None, timeout=30):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def scrape(url, timeout=30):
    """/metrics as {name or name{labels}: value}, without the model_name label every
    series carries (one server serves one model)."""
    text = urllib.request.urlopen(url + "/metrics", timeout=timeout).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, _, value = line.rpartition(" ")
        name = re.sub(r'model_name="(?:[^"\\]|\\.)*",?', "", name).replace("{}", "")
        out[name] = float(value)
    return out


def counter_sum(m, prefix):
    return sum(v for k, v in m.items() if k == prefix or k.startswith(prefix + "{"))


def failures_5xx(m):
    return sum(v for k, v in m.items() if k.startswith('pagoda:request_failure_total{status="5'))


# ---- workload ---------------------------------------------------------------------

def build_specs(cfg, url, model):
    """Seeded request list; prompt token counts come from the server's /tokenize."""
    rng = random.Random(cfg.seed)
    n = cfg.clients
    n_drop = int(round(n * cfg.drop_fraction))
    drop_set = set(rng.sample(range(n), n_drop))
    shared = " ".join(rng.choice(WORDS) for _ in range(64))
    specs = []
    for i in range(n):
        words = rng.randint(*cfg.prompt_words)
        text = " ".join(rng.choice(WORDS) for _ in range(words))
        if rng.random() < cfg.shared_prefix_fraction:
            text = shared + " " + text
        chat = rng.random() < cfg.chat_fraction
        drop = i in drop_set
        max_tokens = cfg.drop_max_tokens if drop else rng.randint(*cfg.max_tokens)
        body = {"max_tokens": max_tokens, "stream": True, "stream_options": {"include_usage": True},
                "ignore_eos": True}
        if model:
            body["model"] = model
        if rng.random() < 0.5:
            body["temperature"] = 0
        else:
            body["temperature"], body["seed"] = 0.8, rng.randint(0, 2**31)
        if chat:
            msgs = [{"role": "user", "content": text}]
            if rng.random() < 0.5:
                msgs.insert(0, {"role": "system", "content": SYSTEM_PROMPT})
            body["messages"] = msgs
            tok = http_json(url, "/tokenize", {"messages": msgs})
        else:
            body["return_token_ids"] = True
            tok = http_json(url, "/tokenize", {"prompt": text})
            # Half the completion prompts go as token ids, half as text.
            body["prompt"] = tok["tokens"] if rng.random() < 0.5 else text
        spec = Spec(i, "chat" if chat else "completions", body, max_tokens, prompt_tokens=tok["count"])
        if drop:
            spec.drop_after = rng.randint(*cfg.drop_after)
            spec.drop_reset = rng.random() < 0.5
        specs.append(spec)
    return specs


# ---- one streaming client -----------------------------------------------------------

async def _read_chunked(reader):
    """Yields the data of each HTTP/1.1 chunk until the last (size 0) one."""
    while True:
        line = await reader.readline()
        if not line:
            raise ConnectionError("connection closed inside a chunked body")
        size = int(line.split(b";")[0].strip(), 16)
        if size == 0:
            await reader.readline()
            return
        data = await reader.readexactly(size)
        await reader.readexactly(2)
        yield data


def _on_event(res, data, now):
    if data == "[DONE]":
        res.done = True
        return
    try:
        j = json.loads(data)
    except ValueError:
        res.error = res.error or "event is not JSON: " + data[:200]
        return
    if j.get("error"):
        res.error = res.error or "error event: " + json.dumps(j["error"])[:300]
        return
    if j.get("usage"):
        res.usage = j["usage"]
    for c in j.get("choices") or []:
        res.chunks += 1
        if res.chunks == 1:
            res.t_first = now
            if res.spec.endpoint == "chat":
                res.role_ok = (c.get("delta") or {}).get("role") == "assistant"
        if "token_ids" in c:
            res.saw_token_ids = True
            res.token_ids += len(c["token_ids"] or [])
        if c.get("finish_reason"):
            res.finish_reason = c["finish_reason"]


async def run_client(host, port, spec, timeout):
    res = Result(spec)
    path = "/v1/chat/completions" if spec.endpoint == "chat" else "/v1/completions"
    body = json.dumps(spec.body).encode()
    res.t_start = time.perf_counter()
    writer = None
    try:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        await writer.drain()

        async def body_reader():
            status_line = await reader.readline()
            res.status = int(status_line.split()[1])
            headers = {}
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b"\n", b""):
                    break
                k, _, v = line.decode().partition(":")
                headers[k.strip().lower()] = v.strip()
            if spec.drop_after == 0:
                res.dropped = True
                return
            if "content-length" in headers:
                res.body = (await reader.readexactly(int(headers["content-length"]))).decode(errors="replace")
                return
            buf = ""
            async for data in _read_chunked(reader):
                buf += data.decode(errors="replace").replace("\r\n", "\n")
                while "\n\n" in buf:
                    event, buf = buf.split("\n\n", 1)
                    for line in event.split("\n"):
                        if line.startswith("data:"):
                            _on_event(res, line[5:].strip(), time.perf_counter())
                    if 0 < spec.drop_after <= res.chunks:
                        res.dropped = True
                        return

        await asyncio.wait_for(body_reader(), timeout)
    except asyncio.TimeoutError:
        res.error = f"timed out after {timeout:.0f} s"
    except (OSError, ConnectionError, ValueError, IndexError, asyncio.IncompleteReadError) as e:
        res.error = f"{type(e).__name__}: {e}"
    finally:
        if writer is not None:
            # For a drop: the real socket close the server must notice, as a FIN or as a reset.
            if res.dropped and spec.drop_reset:
                sock = writer.get_extra_info("socket")
                if sock is not None:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()
            else:
                writer.close()
            try:
                await writer.wait_closed()
            except OSError:
                pass
    res.t_end = time.perf_counter()
    return res


# ---- pollers --------------------------------------------------------------------------

class Poller(threading.Thread):
    """Probes /health and scrapes /metrics while the load runs."""

    def __init__(self, url, interval):
        super().__init__(daemon=True)
        self.url, self.interval = url, interval
        self.stop = threading.Event()
        self.health = []
        self.peaks = {"pagoda:num_requests_running": 0.0, "pagoda:num_requests_waiting": 0.0,
                      "pagoda:kv_cache_usage_perc": 0.0}
        self.errors = []

    def run(self):
        while not self.stop.is_set():
            t0 = time.perf_counter()
            try:
                ok = urllib.request.urlopen(self.url + "/health", timeout=30).status == 200
            except OSError as e:
                ok = False
                self.errors.append(f"/health: {e}")
            self.health.append((ok, time.perf_counter() - t0))
            try:
                m = scrape(self.url)
                for k in self.peaks:
                    self.peaks[k] = max(self.peaks[k], m.get(k, 0.0))
            except OSError as e:
                self.errors.append(f"/metrics: {e}")
            self.stop.wait(self.interval)


def is_idle(m):
    """Nothing running or waiting and no KV block in use (every block free or cached)."""
    idle = (m.get("pagoda:num_requests_running", -1) == 0 and m.get("pagoda:num_requests_waiting", -1) == 0
            and m.get("pagoda:kv_cache_usage_perc", -1) == 0)
    if "pagoda:kv_cache_blocks_total" in m:  # servers without the block gauges: usage alone
        idle = idle and (m.get("pagoda:kv_cache_blocks_free", 0) + m.get("pagoda:kv_cache_blocks_cached", 0)
                         == m["pagoda:kv_cache_blocks_total"])
    return idle


def wait_drained(url, timeout):
    """Polls /metrics until is_idle(). Returns (metrics, seconds, ok)."""
    t0 = time.perf_counter()
    while True:
        m = scrape(url)
        idle = is_idle(m)
        if idle or time.perf_counter() - t0 > timeout:
            return m, time.perf_counter() - t0, idle
        time.sleep(0.1)


# ---- the run ----------------------------------------------------------------------------

def check(report, specs):
    v = report.violations
    for r in report.results:
        s = r.spec
        tag = f"request {s.idx} ({s.endpoint}, max_tokens {s.max_tokens}"
        tag += f", drop after {s.drop_after})" if s.drop_after >= 0 else ")"
        if r.status >= 500:
            v.append(f"{tag}: HTTP {r.status} {r.body[:200]}")
            continue
        if s.drop_after >= 0:
            if r.status != 200:
                v.append(f"{tag}: HTTP {r.status} {r.body[:200]}")
            elif r.error:
                v.append(f"{tag}: {r.error}")
            elif not r.dropped or r.done:
                v.append(f"{tag}: the stream ended before the client dropped it ({r.chunks} chunks)")
            continue
        if r.status != 200:
            v.append(f"{tag}: HTTP {r.status} {r.body[:200]}")
            continue
        if r.error:
            v.append(f"{tag}: {r.error}")
            continue
        if not r.done:
            v.append(f"{tag}: no data: [DONE]")
        if r.chunks != s.max_tokens:
            v.append(f"{tag}: {r.chunks} content chunks")
        u = r.usage or {}
        if u.get("completion_tokens") != s.max_tokens:
            v.append(f"{tag}: usage.completion_tokens {u.get('completion_tokens')}")
        if s.prompt_tokens >= 0 and u.get("prompt_tokens") != s.prompt_tokens:
            v.append(f"{tag}: usage.prompt_tokens {u.get('prompt_tokens')}, /tokenize says {s.prompt_tokens}")
        if r.finish_reason != "length":
            v.append(f"{tag}: finish_reason {r.finish_reason!r}")
        if r.saw_token_ids and r.token_ids != s.max_tokens:
            v.append(f"{tag}: {r.token_ids} token_ids")
        if not r.role_ok:
            v.append(f"{tag}: first chat chunk has no role 'assistant'")


async def _fire(host, port, specs, timeout):
    return await asyncio.gather(*(run_client(host, port, s, timeout) for s in specs))


def run_load(cfg, url, model=None):
    """Runs the load against a server at url; returns a Report (violations empty = pass)."""
    report = Report()
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    if model is None:
        try:
            model = http_json(url, "/v1/models")["data"][0]["id"]
        except (OSError, KeyError, IndexError, ValueError):
            model = None
    specs = build_specs(cfg, url, model)
    report.metrics_before = scrape(url)
    poller = Poller(url, cfg.health_interval)
    poller.start()
    t0 = time.perf_counter()
    report.results = asyncio.run(_fire(host, int(port), specs, cfg.request_timeout))
    report.duration_s = time.perf_counter() - t0
    poller.stop.set()
    poller.join()
    report.health, report.peaks = poller.health, poller.peaks
    after, report.drain_s, idle = wait_drained(url, cfg.drain_timeout)
    report.metrics_after = after
    check(report, specs)
    v = report.violations
    v.extend(poller.errors[:5])
    bad_health = [s for ok, s in report.health if not ok or s > cfg.health_max_s]
    if not report.health:
        v.append("/health was never probed during the load")
    elif bad_health:
        v.append(f"/health: {len(bad_health)} of {len(report.health)} probes failed or took over "
                 f"{cfg.health_max_s} s (slowest {max(s for _, s in report.health):.2f} s)")
    if not idle:
        v.append(f"not drained after {cfg.drain_timeout:.0f} s: running "
                 f"{after.get('pagoda:num_requests_running')}, waiting {after.get('pagoda:num_requests_waiting')}, "
                 f"kv_cache_usage_perc {after.get('pagoda:kv_cache_usage_perc')}, blocks free "
                 f"{after.get('pagoda:kv_cache_blocks_free')} + cached {after.get('pagoda:kv_cache_blocks_cached')} "
                 f"of {after.get('pagoda:kv_cache_blocks_total')}")
    before = report.metrics_before
    d5xx = failures_5xx(after) - failures_5xx(before)
    if d5xx:
        v.append(f"/metrics: {d5xx:.0f} requests answered 5xx (request_failure_total)")
    key = 'pagoda:request_success_total{finished_reason="%s"}'
    d_abort = after.get(key % "abort", 0) - before.get(key % "abort", 0)
    if d_abort != len(report.dropped):
        v.append(f"/metrics: {d_abort:.0f} aborts counted for {len(report.dropped)} dropped streams")
    d_len = after.get(key % "length", 0) - before.get(key % "length", 0)
    if d_len != len(report.completed):
        v.append(f"/metrics: {d_len:.0f} requests finished by length for {len(report.completed)} completed")
    return report


def percentile(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100
    f = int(k)
    c = min(f + 1, len(xs) - 1)
    return xs[f] + (xs[c] - xs[f]) * (k - f)


def summary(report, cfg):
    comp, drop = report.completed, report.dropped
    out_tokens = sum(r.spec.max_tokens for r in comp if not r.error)
    ttft = [r.t_first - r.t_start for r in comp if r.t_first]
    e2e = [r.t_end - r.t_start for r in comp]
    health = [s for _, s in report.health]
    b, a = report.metrics_before, report.metrics_after
    key = 'pagoda:request_success_total{finished_reason="%s"}'

    def delta(name):
        return a.get(name, 0) - b.get(name, 0)

    lines = [
        f"clients                 {len(report.results)} ({sum(r.spec.endpoint == 'chat' for r in report.results)} chat, "
        f"{sum(r.spec.endpoint == 'completions' for r in report.results)} completions), seed {cfg.seed}",
        f"read to the end         {len(comp)}; ok {sum(1 for r in comp if r.status == 200 and not r.error)}",
        f"dropped mid-stream      {len(drop)} (after 0..{cfg.drop_after[1]} chunks; "
        f"{sum(r.spec.drop_after == 0 for r in drop)} right after the headers; "
        f"{sum(r.spec.drop_reset for r in drop)} by TCP reset)",
        f"prompt tokens           {sum(r.spec.prompt_tokens for r in report.results)} "
        f"({min(r.spec.prompt_tokens for r in report.results)}..{max(r.spec.prompt_tokens for r in report.results)})",
        f"output tokens (read)    {out_tokens}",
        f"duration                {report.duration_s:.2f} s; drain {report.drain_s:.2f} s",
        f"output tok/s            {out_tokens / report.duration_s:.1f}" if report.duration_s else "",
        f"TTFT p50 / p99          {percentile(ttft, 50):.2f} / {percentile(ttft, 99):.2f} s",
        f"E2E p50 / p99           {percentile(e2e, 50):.2f} / {percentile(e2e, 99):.2f} s",
        f"/health probes          {len(health)}, max {max(health) if health else float('nan'):.3f} s, "
        f"p50 {percentile(health, 50):.3f} s",
        f"peak running / waiting  {report.peaks.get('pagoda:num_requests_running', 0):.0f} / "
        f"{report.peaks.get('pagoda:num_requests_waiting', 0):.0f}; peak KV usage "
        f"{100 * report.peaks.get('pagoda:kv_cache_usage_perc', 0):.1f}%",
        f"server: length / abort  {delta(key % 'length'):.0f} / {delta(key % 'abort'):.0f}; "
        f"preemptions {delta('pagoda:num_preemptions_total'):.0f}; 5xx {failures_5xx(a) - failures_5xx(b):.0f}",
        f"after drain             running {a.get('pagoda:num_requests_running')}, waiting "
        f"{a.get('pagoda:num_requests_waiting')}, kv_cache_usage_perc {a.get('pagoda:kv_cache_usage_perc')}, "
        f"blocks free {a.get('pagoda:kv_cache_blocks_free')} + cached {a.get('pagoda:kv_cache_blocks_cached')} "
        f"of {a.get('pagoda:kv_cache_blocks_total')}",
        f"before the load         running {b.get('pagoda:num_requests_running')}, waiting "
        f"{b.get('pagoda:num_requests_waiting')}, blocks free {b.get('pagoda:kv_cache_blocks_free')} + cached "
        f"{b.get('pagoda:kv_cache_blocks_cached')} of {b.get('pagoda:kv_cache_blocks_total')}",
    ]
    return "\n".join(l for l in lines if l)


def parse_range(s):
    lo, _, hi = s.partition(":")
    lo, hi = int(lo), int(hi or lo)
    if lo > hi or lo < 0:
        raise argparse.ArgumentTypeError(f"bad range '{s}' (want LO:HI)")
    return lo, hi


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="attach to a running server (default: start one)")
    ap.add_argument("--binary", default=os.path.join(REPO, "build", "src", "cli", "pagoda"))
    ap.add_argument("-m", "--model-file", default=DEFAULT_MODEL)
    ap.add_argument("--server-arg", action="append", default=[],
                    help="extra `pagoda serve` argument (repeat), e.g. --server-arg=--kv-cache-memory=128MiB")
    ap.add_argument("--clients", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--drop-fraction", type=float, default=0.2)
    ap.add_argument("--chat-fraction", type=float, default=0.5)
    ap.add_argument("--max-tokens", type=parse_range, default=(16, 128), help="LO:HI for clients that read to the end")
    ap.add_argument("--drop-max-tokens", type=int, default=256)
    ap.add_argument("--drop-after", type=parse_range, default=(0, 4))
    ap.add_argument("--prompt-words", type=parse_range, default=(8, 200))
    ap.add_argument("--request-timeout", type=float, default=1800)
    ap.add_argument("--health-max-s", type=float, default=2.0)
    ap.add_argument("--drain-timeout", type=float, default=60)
    ap.add_argument("--json", help="write the summary and violations as JSON here")
    a = ap.parse_args(argv)
    cfg = LoadConfig(clients=a.clients, seed=a.seed, drop_fraction=a.drop_fraction, chat_fraction=a.chat_fraction,
                     max_tokens=a.max_tokens, drop_max_tokens=a.drop_max_tokens, drop_after=a.drop_after,
                     prompt_words=a.prompt_words, request_timeout=a.request_timeout, health_max_s=a.health_max_s,
                     drain_timeout=a.drain_timeout)
    if a.drop_max_tokens <= a.drop_after[1] + 8:
        ap.error("--drop-max-tokens must exceed the last --drop-after chunk by more than 8")
    if a.url:
        report = run_load(cfg, a.url.rstrip("/"))
        log = []
    else:
        if not os.path.exists(a.model_file):
            print(f"serve_load: model file {a.model_file} is missing (scripts/setup fetches it)", file=sys.stderr)
            return 2
        with PagodaServer(a.binary, a.model_file, a.server_arg) as srv:
            report = run_load(cfg, srv.url)
            log = srv.log
    print(summary(report, cfg))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"summary": summary(report, cfg).splitlines(), "violations": report.violations,
                       "duration_s": report.duration_s, "metrics_before": report.metrics_before,
                       "metrics_after": report.metrics_after, "peaks": report.peaks}, f, indent=1)
    if report.violations:
        print(f"\nFAIL: {len(report.violations)} violation(s)", file=sys.stderr)
        for line in report.violations[:40]:
            print("  " + line, file=sys.stderr)
        if log:
            print("server log tail:\n" + "".join(log[-20:]), file=sys.stderr)
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
