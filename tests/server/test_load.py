#!/usr/bin/env python3
"""The CI size of the HTTP load test (bench/serve_load.py, issue #6) against SmolLM2:
24 concurrent streaming clients, mixed prompt lengths and max_tokens, 20% of them
closing the socket mid-stream, on a KV pool small enough to preempt.

Usage: test_load.py PAGODA_BINARY DEFAULT_MODEL
"""
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))
import serve_load  # noqa: E402
from serverutil import PagodaServer  # noqa: E402

BINARY, SMOL = sys.argv[1], sys.argv[2]


@unittest.skipUnless(os.path.exists(SMOL), "default model not fetched (scripts/setup)")
class SmallLoad(unittest.TestCase):
    def test_24_clients_20_percent_dropped(self):
        cfg = serve_load.LoadConfig(clients=24, seed=7, max_tokens=(4, 16), drop_max_tokens=48, drop_after=(0, 3),
                                    prompt_words=(4, 40), request_timeout=300, health_max_s=5.0, drain_timeout=60)
        # 64 blocks x 16 = 1024 tokens for ~1800 prompt tokens: admission waits and preemption happen.
        with PagodaServer(BINARY, SMOL, ["--served-model-name", "smol", "-c", "1024", "--num-kv-blocks", "64"]) as srv:
            report = serve_load.run_load(cfg, srv.url)
            summary = serve_load.summary(report, cfg)
            print(summary, file=sys.stderr)
            self.assertEqual(report.violations, [], summary + "\n" + "".join(srv.log[-20:]))
        self.assertEqual(len(report.results), 24)
        self.assertEqual(len(report.dropped), 5)  # round(24 * 0.2)
        self.assertEqual(len(report.completed), 19)
        self.assertEqual({r.spec.endpoint for r in report.results}, {"chat", "completions"})
        # The completions ask for token ids: each got exactly max_tokens of them.
        comp = [r for r in report.completed if r.spec.endpoint == "completions"]
        self.assertTrue(comp and all(r.saw_token_ids and r.token_ids == r.spec.max_tokens for r in comp))
        before, after = report.metrics_before, report.metrics_after
        # A fresh server reports its whole pool free before the first request.
        self.assertEqual(before["pagoda:kv_cache_blocks_total"], 64 - 1)  # minus the null block
        self.assertEqual(before["pagoda:kv_cache_blocks_free"], 63)
        self.assertEqual(after["pagoda:kv_cache_blocks_free"] + after["pagoda:kv_cache_blocks_cached"], 63)
        self.assertEqual(after["pagoda:num_requests_running"], 0)
        self.assertEqual(after["pagoda:num_requests_waiting"], 0)
        self.assertEqual(after["pagoda:kv_cache_usage_perc"], 0)
        self.assertGreater(len(report.health), 0)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v"])
