"""End-to-end tests of `pagoda router` (issue 16): two `pagoda serve` replicas
(-t 1 each, free loopback ports) behind a prefix-affinity router and a round-robin
router. Stickiness, round-robin spread, chat routing, then failover: one replica
is killed while a streaming and a non-streaming request run on it.

  test_router.py PAGODA_BINARY MODEL_GGUF [TEST_NAME ...]

RouterFaultTest drives the same router against fake replicas (a 503, a stream cut
mid-event, an unreachable address), which needs no model.
"""
import json
import os
import signal
import sys
import threading
import time
import unittest
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "server"))
from serverutil import PagodaServer, post_json  # noqa: E402

BINARY = MODEL = None


def counter_sum(m, name):
    return sum(v for k, v in m.items() if k == name or k.startswith(name + "{"))


def served(replicas):
    """Requests each replica has finished (successes plus errors)."""
    return [counter_sum(r.metrics(), "pagoda:request_success_total") if r.proc.poll() is None else -1
            for r in replicas]


# A long shared prefix per group (well over --affinity-blocks 4 x --block-size 16 =
# 64 tokens), then a short distinct suffix.
def group_prompt(g, i):
    story = " ".join(f"Chapter {g}: the {w} fox of village {g} walked to the river" for w in
                     ["red", "quick", "brown", "lazy", "small", "tall", "old", "young"])
    return f"{story}. Question {i}: what happened next?"


class RouterTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.reps = [PagodaServer(BINARY, MODEL, ["-t", "1"]).__enter__() for _ in range(2)]
        urls = []
        for r in cls.reps:
            urls += ["--replica", r.url]
        common = ["--block-size", "16", "--affinity-blocks", "4"]
        # A long health interval: failures must be found by the requests themselves.
        cls.router = PagodaServer(BINARY, MODEL, urls + common + ["--health-interval", "30"],
                                  command="router").__enter__()
        cls.rr = PagodaServer(BINARY, MODEL, urls + common + ["--policy", "round-robin"],
                              command="router").__enter__()

    @classmethod
    def tearDownClass(cls):
        for s in [cls.router, cls.rr] + cls.reps:
            s.__exit__(None, None, None)

    def complete(self, url, prompt, max_tokens=4, **extra):
        status, body = post_json(url + "/v1/completions",
                                 dict(prompt=prompt, max_tokens=max_tokens, temperature=0, **extra))
        self.assertEqual(status, 200, body)
        return body

    def which(self, url, prompt):
        """Sends one request; returns (replica index that served it, response)."""
        before = served(self.reps)
        body = self.complete(url, prompt)
        # A replica counts a request just after sending its answer: wait for it.
        deadline = time.time() + 10
        while True:
            after = served(self.reps)
            moved = [i for i in range(2) if after[i] != before[i]]
            if moved or time.time() > deadline:
                break
            time.sleep(0.005)
        self.assertEqual(len(moved), 1, (before, after))
        return moved[0], body

    def test_1_stickiness(self):
        m0 = self.router.metrics()
        owners = {}
        for i in range(4):
            for g in range(4):
                rep, body = self.which(self.router.url, group_prompt(g, i))
                owners.setdefault(g, set()).add(rep)
                if i > 0:  # the group's prefix is cached on its replica after the first request
                    self.assertGreaterEqual(body["usage"]["prompt_tokens_details"]["cached_tokens"], 64, body)
        self.assertTrue(all(len(s) == 1 for s in owners.values()), owners)
        m1 = self.router.metrics()
        d = lambda k: m1[k] - m0.get(k, 0)  # noqa: E731
        self.assertEqual(d('pagoda:router_routing_decisions_total{kind="affinity"}'), 16)
        self.assertEqual(d('pagoda:router_routing_decisions_total{kind="least_loaded"}'), 0)
        # A prompt shorter than one block goes to the least-loaded replica.
        self.complete(self.router.url, "Hi")
        self.assertEqual(self.router.metrics()['pagoda:router_routing_decisions_total{kind="least_loaded"}'],
                         m1['pagoda:router_routing_decisions_total{kind="least_loaded"}'] + 1)

    def test_2_round_robin_spreads(self):
        seen = [self.which(self.rr.url, group_prompt(7, i))[0] for i in range(6)]
        self.assertEqual(sorted(seen), [0, 0, 0, 1, 1, 1], seen)
        self.assertTrue(all(seen[i] != seen[i + 1] for i in range(5)), seen)
        m = self.rr.metrics()
        self.assertEqual(m['pagoda:router_routing_decisions_total{kind="round_robin"}'], 6)

    def test_3_chat_sticks_and_streams(self):
        msgs = lambda q: [{"role": "system", "content": group_prompt(9, 0)}, {"role": "user", "content": q}]  # noqa
        reps = set()
        for q in ["Who?", "Where?", "When?"]:
            before = served(self.reps)
            req = urllib.request.Request(
                self.router.url + "/v1/chat/completions",
                data=json.dumps({"messages": msgs(q), "max_tokens": 3, "stream": True}).encode(),
                headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=120) as r:
                self.assertTrue(r.headers["Content-Type"].startswith("text/event-stream"))
                events = [ln for ln in r.read().decode().split("\n\n") if ln.strip()]
            self.assertEqual(events[-1], "data: [DONE]")
            self.assertTrue(all(json.loads(e[6:])["object"] == "chat.completion.chunk" for e in events[:-1]))
            deadline = time.time() + 10
            while served(self.reps) == before and time.time() < deadline:
                time.sleep(0.005)
            after = served(self.reps)
            reps |= {i for i in range(2) if after[i] != before[i]}
        self.assertEqual(len(reps), 1, reps)

    def test_4_failover(self):
        # The replica that owns group 5's prefix.
        victim, _ = self.which(self.router.url, group_prompt(5, 0))
        other = 1 - victim
        m0 = self.router.metrics()
        # A long stream and a long non-streaming request, both on the victim.
        body = dict(prompt=group_prompt(5, 1), max_tokens=400, temperature=0, ignore_eos=True)
        stream_req = urllib.request.Request(self.router.url + "/v1/completions",
                                            data=json.dumps(dict(body, stream=True)).encode(),
                                            headers={"Content-Type": "application/json"})
        stream = urllib.request.urlopen(stream_req, timeout=120)
        first = stream.readline()
        self.assertTrue(first.startswith(b"data: {"), first)
        result = {}
        t = threading.Thread(target=lambda: result.update(
            r=post_json(self.router.url + "/v1/completions", dict(body, prompt=group_prompt(5, 2), max_tokens=40))))
        t.start()
        deadline = time.time() + 20
        while self.reps[victim].metrics()["pagoda:num_requests_running"] < 2 and time.time() < deadline:
            time.sleep(0.02)
        self.assertEqual(self.reps[victim].metrics()["pagoda:num_requests_running"], 2)
        self.reps[victim].proc.send_signal(signal.SIGKILL)
        self.reps[victim].proc.wait()
        rest = stream.read().decode()
        stream.close()
        events = [e for e in rest.split("\n\n") if e.strip()]
        self.assertEqual(events[-1].strip(), "data: [DONE]", events[-3:])
        err = json.loads(events[-2].strip()[6:])
        self.assertIn("error", err)
        self.assertIn("failed mid-stream", err["error"]["message"])
        t.join(timeout=120)
        status, answer = result["r"]
        self.assertEqual(status, 200, answer)  # retried on the other replica
        self.assertEqual(answer["usage"]["completion_tokens"], 40)
        # Later requests of every group are answered by the survivor.
        for g in range(4):
            self.assertEqual(self.which(self.router.url, group_prompt(g, 9))[0], other)
        m1 = self.router.metrics()
        rep = lambda i: '{replica="%s"}' % self.reps[i].url  # noqa: E731
        self.assertEqual(m1["pagoda:router_replica_healthy" + rep(victim)], 0)
        self.assertEqual(m1["pagoda:router_replica_healthy" + rep(other)], 1)
        self.assertEqual(m1["pagoda:router_stream_errors_total"] - m0["pagoda:router_stream_errors_total"], 1)
        self.assertEqual(m1["pagoda:router_retries_total"] - m0["pagoda:router_retries_total"], 1)
        with urllib.request.urlopen(self.router.url + "/health", timeout=10) as r:
            self.assertEqual(json.loads(r.read()), {"healthy_replicas": 1, "replicas": 2})


class FakeReplica:
    """A replica stand-in on a free loopback port: GET /health answers 200; POST
    /v1/completions answers by `mode`: "ok" (200 JSON naming the replica), "ok-close" (the
    same, then the connection closed while the router may keep it), "503", or
    "cut" (a chunked SSE stream that closes mid-event, as a replica that dies)."""

    def __init__(self, name):
        import http.server
        fake = self
        self.name, self.mode, self.posts = name, "ok", 0

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def reply(self, status, body):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self.reply(200, {})

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                fake.posts += 1
                if fake.mode == "ok":
                    return self.reply(200, {"replica": fake.name})
                if fake.mode == "503":
                    return self.reply(503, {"error": {"message": "busy " + fake.name}})
                if fake.mode == "ok-close":  # closes the connection without saying so (no Connection: close)
                    self.reply(200, {"replica": fake.name})
                    self.close_connection = True
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for piece in [b'data: {"n":1}\n\n', b'data: {"par']:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                    self.wfile.flush()
                self.close_connection = True

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = "http://127.0.0.1:%d" % self.httpd.server_address[1]


class RouterFaultTest(unittest.TestCase):
    """Retries, pass-through of a 5xx, a cut stream and a replica's return, against
    fake replicas (no model: token-id prompts, `-m none`)."""

    @classmethod
    def setUpClass(cls):
        cls.fakes = [FakeReplica("A"), FakeReplica("B")]
        urls = []
        for f in cls.fakes:
            urls += ["--replica", f.url]
        cls.router = PagodaServer(BINARY, "none", urls + ["--health-interval", "0.2"], command="router").__enter__()

    @classmethod
    def tearDownClass(cls):
        cls.router.__exit__(None, None, None)
        for f in cls.fakes:
            f.httpd.shutdown()

    def setUp(self):
        for f in self.fakes:
            f.mode = "ok"
        self.wait_healthy(2)

    def wait_healthy(self, n):
        deadline = time.time() + 10
        while time.time() < deadline:
            with urllib.request.urlopen(self.router.url + "/metrics", timeout=10) as r:
                text = r.read().decode()
            up = [ln for ln in text.splitlines() if ln.startswith("pagoda:router_replica_healthy{") and ln.endswith(" 1")]
            if len(up) == n:
                return
            time.sleep(0.05)
        self.fail("router did not see %d healthy replicas" % n)

    def rep(self, f):
        return '{replica="%s"}' % f.url

    def test_5xx_is_retried_on_the_other_replica(self):
        a, b = self.fakes
        a.mode = "503"
        m0 = self.router.metrics()
        for i in range(6):
            status, body = post_json(self.router.url + "/v1/completions", {"prompt": [1, 2 + i], "max_tokens": 1})
            self.assertEqual((status, body), (200, {"replica": "B"}))
        m1 = self.router.metrics()
        to_a = m1["pagoda:router_requests_total" + self.rep(a)] - m0["pagoda:router_requests_total" + self.rep(a)]
        self.assertGreater(to_a, 0)
        self.assertEqual(m1["pagoda:router_retries_total"] - m0["pagoda:router_retries_total"], to_a)
        self.assertEqual(m1["pagoda:router_replica_healthy" + self.rep(a)], 1)  # busy is not dead
        # Both busy: the client gets the replicas' own 503.
        b.mode = "503"
        status, body = post_json(self.router.url + "/v1/completions", {"prompt": [1, 2], "max_tokens": 1})
        self.assertEqual(status, 503)
        self.assertTrue(body["error"]["message"].startswith("busy "), body)

    def test_connections_are_kept_alive_and_a_closed_one_is_replaced(self):
        def total(m, kind):
            return sum(m['pagoda:router_upstream_connections_total{replica="%s",kind="%s"}' % (f.url, kind)]
                       for f in self.fakes)
        m0 = self.router.metrics()
        for i in range(8):
            status, body = post_json(self.router.url + "/v1/completions", {"prompt": [1, 2 + i], "max_tokens": 1})
            self.assertEqual(status, 200, body)
        m1 = self.router.metrics()
        # One after another: at most one new connection per replica, every other call reuses one.
        self.assertLessEqual(total(m1, "opened") - total(m0, "opened"), 2)
        self.assertEqual(total(m1, "opened") + total(m1, "reused") - total(m0, "opened") - total(m0, "reused"), 8)
        # Replicas that close each connection after answering: the kept one fails before any
        # byte of an answer and the request goes again on a new connection, to the same replica.
        for f in self.fakes:
            f.mode = "ok-close"
        for i in range(6):
            status, body = post_json(self.router.url + "/v1/completions", {"prompt": [1, 2 + i], "max_tokens": 1})
            self.assertEqual(status, 200, body)
        m2 = self.router.metrics()
        self.assertEqual(m2["pagoda:router_retries_total"], m1["pagoda:router_retries_total"])
        self.assertGreaterEqual(total(m2, "opened") - total(m1, "opened"), 4)
        for f in self.fakes:
            self.assertEqual(m2["pagoda:router_replica_healthy" + self.rep(f)], 1)

    def test_cut_stream_ends_with_an_error_event_and_the_replica_returns(self):
        for f in self.fakes:
            f.mode = "cut"
        m0 = self.router.metrics()
        req = urllib.request.Request(self.router.url + "/v1/completions",
                                     data=json.dumps({"prompt": [1, 2], "stream": True}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            text = r.read().decode()
        events = text.split("\n\n")
        self.assertEqual(events[0], 'data: {"n":1}')
        self.assertEqual(events[1], 'data: {"par')  # what the replica sent, as it sent it
        err = json.loads(events[2][len("data: "):])
        self.assertIn("failed mid-stream", err["error"]["message"])
        self.assertEqual(events[3:], ["data: [DONE]", ""])
        m1 = self.router.metrics()
        self.assertEqual(m1["pagoda:router_stream_errors_total"] - m0["pagoda:router_stream_errors_total"], 1)
        self.assertEqual(m1["pagoda:router_retries_total"], m0["pagoda:router_retries_total"])  # bytes were sent
        # Off the ring after the failure, back once /health answers (every 0.2 s).
        self.wait_healthy(2)

    def test_bad_flags_are_refused_with_a_message(self):
        import subprocess
        cases = [([], 2, "at least one --replica URL is needed"),
                 (["--replica", "http://127.0.0.1:1", "--policy", "x"], 2, "--policy must be prefix"),
                 (["--replica", "127.0.0.1:1"], 1, "must start with http://"),
                 (["--replica", "http://127.0.0.1:1,http://127.0.0.1:1/"], 1, "is given twice"),
                 (["--replica", "http://127.0.0.1:1", "-m", "/nonexistent.gguf"], 1, "cannot open"),
                 (["--replica", "http://127.0.0.1:1", "--max-imbalance", "-1"], 2, "--max-imbalance must be")]
        for args, rc, msg in cases:
            p = subprocess.run([BINARY, "router", "--port", "0"] + args, capture_output=True, text=True, timeout=30)
            self.assertEqual(p.returncode, rc, (args, p.stderr))
            self.assertIn(msg, p.stderr, args)

    def test_unreachable_replica_is_skipped(self):
        import socket
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        dead = "http://127.0.0.1:%d" % s.getsockname()[1]
        s.close()  # nothing listens there
        a = self.fakes[0]
        with PagodaServer(BINARY, "none", ["--replica", dead, "--replica", a.url, "--health-interval", "60"],
                          command="router") as rt:
            # Probed at start: the dead one is off the ring before any request.
            m = rt.metrics()
            self.assertEqual(m['pagoda:router_replica_healthy{replica="%s"}' % dead], 0)
            for i in range(4):
                status, body = post_json(rt.url + "/v1/completions", {"prompt": [1, 2 + i]})
                self.assertEqual((status, body), (200, {"replica": "A"}))
            self.assertEqual(rt.metrics()['pagoda:router_requests_total{replica="%s"}' % dead], 0)


if __name__ == "__main__":
    BINARY, MODEL = sys.argv[1], sys.argv[2]
    if not os.path.exists(MODEL):
        print(f"skipped: {MODEL} is missing (scripts/setup fetches it)")
        sys.exit(77)
    unittest.main(argv=sys.argv[:1] + sys.argv[3:], verbosity=2)  # extra arguments: test names
