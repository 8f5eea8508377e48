#!/usr/bin/env python3
"""Issue 36: POST /reset_prefix_cache and the pin / priority metrics against a real
`pagoda serve` (SmolLM2, --scheduling-policy priority).

- idle: 200, the cached blocks go (pagoda:kv_cache_blocks_cached 0, resets counted);
- while a request streams: 409 naming the running requests, nothing changes; with
  ?force=true: 200, and the streaming request still completes with exactly the
  tokens of the same request run alone (it is preempted and recomputes);
- bad query values: 400 naming the parameter; ?tiers=true (and vLLM's
  reset_external=true) on a server without tiers: 200 with no tier counts
  (tests/tier/test_tier_server.py clears real tiers); GET: 405;
- /metrics carries pagoda:kv_pinned_blocks, pagoda:kv_pins_created_total and the
  per-priority gauges with their five buckets.

Usage: test_reset_prefix_cache.py PAGODA_BINARY MODEL
"""
import http.client
import json
import os
import re
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from serverutil import OneServerPerClass  # noqa: E402

BINARY, MODEL = sys.argv[1], sys.argv[2]
if not os.path.exists(MODEL):
    print(f"{'error' if os.environ.get('CI') == 'true' else 'skipped'}: {MODEL} not found")
    sys.exit(1 if os.environ.get("CI") == "true" else 77)

PROMPT = "The history of the printing press begins in Mainz, where " * 6


def request(port, method, path, body=None, timeout=300):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request(method, path, body=None if body is None else json.dumps(body),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


def metric(port, name):
    _, text = request(port, "GET", "/metrics")
    m = re.search(r"^" + re.escape(name) + r"(\{[^}]*\})? ([0-9.e+-]+)$", text.decode(), re.M)
    return None if m is None else float(m.group(2))


MODEL_NAME = os.path.splitext(os.path.basename(MODEL))[0]  # the served name: the file stem


def completion(max_tokens):
    return {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}


class ResetPrefixCache(OneServerPerClass, unittest.TestCase):
    SERVER = (BINARY, MODEL, ["--scheduling-policy", "priority", "--kv-pinned-fraction", "0.25",
                              "--max-num-batched-tokens", "256"])

    def wait_metric(self, name, pred, timeout=10):
        end = time.time() + timeout
        v = metric(self.srv.port, name)
        while not pred(v) and time.time() < end:
            time.sleep(0.05)
            v = metric(self.srv.port, name)
        return v

    def test_1_idle_reset_clears_the_cache(self):
        st, _ = request(self.srv.port, "POST", "/v1/completions", completion(1))
        self.assertEqual(st, 200)
        self.assertGreater(self.wait_metric("pagoda:kv_cache_blocks_cached", lambda v: v and v > 0), 0)
        resets = metric(self.srv.port, "pagoda:prefix_cache_resets_total") or 0
        st, body = request(self.srv.port, "POST", "/reset_prefix_cache")
        self.assertEqual(st, 200, body)
        self.assertEqual(json.loads(body), {"status": "ok"})
        self.assertEqual(metric(self.srv.port, "pagoda:kv_cache_blocks_cached"), 0)
        self.assertEqual(metric(self.srv.port, "pagoda:prefix_cache_resets_total"), resets + 1)

    def test_2_running_requests_refuse_unless_forced(self):
        st, body = request(self.srv.port, "POST", "/v1/completions", completion(120))
        self.assertEqual(st, 200)
        want = json.loads(body)["choices"][0]["text"]
        out = {}

        def run():
            out["status"], out["body"] = request(self.srv.port, "POST", "/v1/completions", completion(120))

        t = threading.Thread(target=run)
        t.start()
        self.assertEqual(self.wait_metric("pagoda:num_requests_running", lambda v: v == 1), 1)
        st, body = request(self.srv.port, "POST", "/reset_prefix_cache")
        self.assertEqual(st, 409, body)
        err = json.loads(body)["error"]
        self.assertIn("running", err["message"])
        self.assertEqual(err["param"], "force")
        st, body = request(self.srv.port, "POST", "/reset_prefix_cache?force=true")
        self.assertEqual(st, 200, body)
        t.join(timeout=300)
        self.assertEqual(out["status"], 200)
        got = json.loads(out["body"])
        self.assertEqual(got["choices"][0]["text"], want)  # preempted, recomputed, identical
        self.assertEqual(got["usage"]["completion_tokens"], 120)

    def test_3_bad_queries(self):
        st, body = request(self.srv.port, "POST", "/reset_prefix_cache?force=maybe")
        self.assertEqual(st, 400)
        self.assertEqual(json.loads(body)["error"]["param"], "force")
        st, body = request(self.srv.port, "POST", "/reset_prefix_cache?tiers=yes")
        self.assertEqual(st, 400)
        self.assertEqual(json.loads(body)["error"]["param"], "tiers")
        st, body = request(self.srv.port, "POST", "/reset_prefix_cache?reset_external=2")
        self.assertEqual(st, 400)
        self.assertEqual(json.loads(body)["error"]["param"], "reset_external")
        for q in ("tiers=true", "reset_external=true"):
            st, body = request(self.srv.port, "POST", "/reset_prefix_cache?" + q)
            self.assertEqual(st, 200, body)
            self.assertEqual(json.loads(body), {"status": "ok", "tiers": {}})
        st, _ = request(self.srv.port, "GET", "/reset_prefix_cache")
        self.assertEqual(st, 405)

    def test_4_metrics(self):
        _, text = request(self.srv.port, "GET", "/metrics")
        text = text.decode()
        for name in ("pagoda:kv_pins", "pagoda:kv_pinned_blocks", "pagoda:kv_pinned_blocks_cap",
                     "pagoda:kv_pins_created_total", "pagoda:kv_pins_expired_total", "pagoda:kv_pins_demoted_total"):
            self.assertIsNotNone(re.search(r"^" + re.escape(name) + r"[{ ]", text, re.M), name)
        for kind in ("waiting", "running"):
            buckets = re.findall(r'^pagoda:num_requests_' + kind + r'_by_priority\{[^}]*priority="([^"]+)"\}', text, re.M)
            self.assertEqual(sorted(buckets), sorted(["negative", "0", "1-9", "10-99", "100+"]), kind)
        # 0.25 of the pool.
        total = metric(self.srv.port, "pagoda:kv_cache_blocks_total")
        self.assertEqual(metric(self.srv.port, "pagoda:kv_pinned_blocks_cap"), int(total * 0.25))


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
