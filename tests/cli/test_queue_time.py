"""Issue 20: request_queue_time_seconds is vLLM's time spent WAITING, exact per request:
from arrival to the step that first schedules the request, however long it waits
behind admission (--max-num-seqs, a full KV pool), and queue + prefill + decode = e2e.

One /v1/completions request with two prompts: both arrive together (one submission,
one arrival time), and the second can only be scheduled once the first has finished,
so its queue time covers the first one's whole queue + prefill + decode. The per-request
times come from the server's debug line (one per engine request, the values the
histograms observe) and are checked against /metrics too. The inequalities hold by
construction (consecutive timestamps of one clock), whatever the machine's speed.
Usage: test_queue_time.py PAGODA DATA_DIR
"""
import os
import re
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clitest import Launched, parse_series  # noqa: E402

BINARY, DATA = sys.argv[1], sys.argv[2]
MODEL = os.path.join(DATA, "stories260K.gguf")
LINE = re.compile(r"request (\d+) \(submission (\d+), prompt (\d+)\): queue=([\d.]+)s prefill=([\d.]+)s "
                  r"decode=([\d.]+)s e2e=([\d.]+)s")
ROUND = 2.5e-6  # four values printed with 6 decimals


class QueueTime(unittest.TestCase):
    def check(self, flags, prompts, max_tokens):
        srv = Launched(BINARY, ["serve", MODEL, "--port", "0", "--log-level", "debug", "--log-stats-interval", "0",
                                "-t", "1", *flags])
        try:
            self.assertIsNotNone(srv.port, srv.text())
            r = srv.post("/v1/completions", {"prompt": prompts, "max_tokens": max_tokens, "temperature": 0,
                                             "ignore_eos": True})
            self.assertEqual(r["usage"]["completion_tokens"], 2 * max_tokens)
            metrics = parse_series(srv.get("/metrics"))
            for _ in range(50):  # the access and debug lines are written before the response; the drain reads on
                rows = [m.groups() for m in LINE.finditer(srv.text())]
                if len(rows) == 2:
                    break
                time.sleep(0.1)
        finally:
            srv.stop()
        self.assertEqual(len(rows), 2, srv.text())
        by_prompt = {int(r[2]): [float(x) for x in r[3:]] for r in rows}
        self.assertEqual(len({r[1] for r in rows}), 1)  # one submission
        for q, p, d, e in by_prompt.values():
            self.assertAlmostEqual(q + p + d, e, delta=ROUND)
            self.assertGreater(p, 0)
        (q0, p0, d0, e0), (q1, p1, d1, e1) = by_prompt[0], by_prompt[1]
        # Prompt 1 waited behind prompt 0's whole run: it was scheduled only after prompt 0 ended.
        self.assertGreaterEqual(q1, e0 - ROUND)
        self.assertGreater(q1, q0)
        self.assertGreater(q1, 0)

        # The histograms observed exactly these values.
        def hist(name):
            return metrics["pagoda:" + name + "_sum"][0][1], metrics["pagoda:" + name + "_count"][0][1]
        sums = {}
        for i, name in enumerate(["request_queue_time_seconds", "request_prefill_time_seconds",
                                  "request_decode_time_seconds", "e2e_request_latency_seconds"]):
            total, count = hist(name)
            self.assertEqual(count, 2, name)
            self.assertAlmostEqual(total, by_prompt[0][i] + by_prompt[1][i], delta=2 * ROUND)
            sums[name] = total
        self.assertAlmostEqual(sums["request_queue_time_seconds"] + sums["request_prefill_time_seconds"] +
                               sums["request_decode_time_seconds"], sums["e2e_request_latency_seconds"], delta=1e-9)

    def test_waits_behind_max_num_seqs(self):
        self.check(["--max-num-seqs", "1"], ["Once upon a time", "The cat sat on the"], 8)

    def test_waits_behind_a_full_pool(self):
        # 4 usable blocks of 16 tokens; each request needs 3 (40 prompt + 8 output tokens),
        # so the second is admitted only when the first has given its blocks back.
        self.check(["--max-num-seqs", "4", "--num-kv-blocks", "5", "--block-size", "16"],
                   [list(range(10, 50)), list(range(100, 140))], 8)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v"])
