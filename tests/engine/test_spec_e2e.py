#!/usr/bin/env python3
"""Speculative decoding through `pagoda serve` with the official openai client:
greedy completions of copy-heavy prompts are the same text with
--speculative-config as without, streamed and not, and /metrics counts the drafts
under vLLM's spec_decode_* names (accepted <= draft tokens, per-position sum).
A bad --speculative-config stops serve with a clear message.

usage: test_spec_e2e.py PAGODA_BINARY TESTS_DATA_DIR
"""
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "server"))
from serverutil import PagodaServer  # noqa: E402

BINARY, DATA = sys.argv[1], sys.argv[2]
MODEL = os.path.join(DATA, "stories260K.gguf")
PROMPTS = [
    "Once upon a time, there was a little girl named Lily. She loved to play outside. "
    "Once upon a time, there was a little girl named",
    "The cat sat on the mat. The dog sat on the log. The cat sat on the mat. The dog",
    "Tom had a red ball. Tom had a blue car. Tom had a red ball. Tom had",
]
SPEC = ["--speculative-config",
        '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":3,"prompt_lookup_min":1,'
        '"adaptive_length":false}']  # drafts independent of step timing, so the counts below hold on any machine


def completions(srv, stream):
    import openai
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120)
    out = []
    for p in PROMPTS:
        kw = dict(model="stories260K", prompt=p, max_tokens=80, temperature=0, seed=1)
        if stream:
            out.append("".join(c.choices[0].text for c in client.completions.create(stream=True, **kw)))
        else:
            out.append(client.completions.create(**kw).choices[0].text)
    return out


class SpecE2E(unittest.TestCase):
    def test_same_text_and_metrics(self):
        base = ["-t", "1", "--kv-cache-memory", "16MiB"]
        with PagodaServer(BINARY, MODEL, base) as plain:
            want = completions(plain, stream=False)
            m0 = plain.metrics()
        self.assertEqual(m0.get("pagoda:spec_decode_num_drafts_total"), 0.0)
        with PagodaServer(BINARY, MODEL, base + SPEC) as spec:
            self.assertEqual(completions(spec, stream=False), want)
            self.assertEqual(completions(spec, stream=True), want)
            m = spec.metrics()
        drafts = m["pagoda:spec_decode_num_drafts_total"]
        draft_tokens = m["pagoda:spec_decode_num_draft_tokens_total"]
        accepted = m["pagoda:spec_decode_num_accepted_tokens_total"]
        self.assertGreater(drafts, 0)
        self.assertGreater(accepted, 0)
        self.assertLessEqual(accepted, draft_tokens)
        self.assertLessEqual(draft_tokens, 4 * drafts)
        per_pos = {k: v for k, v in m.items() if k.startswith("pagoda:spec_decode_num_accepted_tokens_per_pos{")}
        self.assertEqual(sum(per_pos.values()), accepted)
        self.assertIn('pagoda:spec_decode_num_accepted_tokens_per_pos{position="0"}', per_pos)

    def test_bad_config_is_refused(self):
        for flags, msg in [(['--speculative-config', '{"method":"eagle","num_speculative_tokens":2}'],
                            'method "eagle" is not supported'),
                           (['--speculative-config', '{"method":"ngram"}'], "needs num_speculative_tokens"),
                           (['--speculative-config', 'ngram'], "must be a JSON object"),
                           (['--speculative-ngram', '99'], "--speculative-ngram must be an integer in 0..32")]:
            r = subprocess.run([BINARY, "serve", "-m", MODEL, "--port", "0"] + flags, capture_output=True,
                               text=True, timeout=60)
            self.assertNotEqual(r.returncode, 0, flags)
            self.assertIn(msg, r.stderr, flags)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
