"""End-to-end tests of `pagoda router` (issue 16): two `pagoda serve` replicas
(-t 1 each, free loopback ports) behind a prefix-affinity router and a round-robin
router. Stickiness, round-robin spread, chat routing, then failover: one replica
is killed while a streaming and a non-streaming request run on it.

  test_router.py PAGODA_BINARY MODEL_GGUF
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


if __name__ == "__main__":
    BINARY, MODEL = sys.argv[1], sys.argv[2]
    if not os.path.exists(MODEL):
        print(f"skipped: {MODEL} is missing (scripts/setup fetches it)")
        sys.exit(77)
    unittest.main(argv=sys.argv[:1], verbosity=2)
