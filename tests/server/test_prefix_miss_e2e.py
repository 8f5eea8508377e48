"""Why a prefix missed, end to end (issue 36).

A two-turn conversation through Qwen3's chat template (tests/tok/fixtures), which
drops the <think> block of assistant turns before the last user message. Turn 1's
reply is cached as generated; turn 2's prompt renders that reply without its
reasoning block, so its prefix hit ends inside turn 1's reply. Checks that
`pagoda template --check-prefix-stability` flags the break at token P (exit 3),
and that `pagoda serve --chat-template` reports the second request with cause
"diverged" at the same P, the same way in the x-pagoda-prefix header, the
access log line and /metrics (pagoda:prefix_cache_miss_total{cause="diverged"}).
Bad input to the checker (missing file, bad JSON, no template) is an error.

usage: test_prefix_miss_e2e.py PAGODA SMOLLM2.gguf
"""
import json
import time
import os
import re
import subprocess
import sys
import tempfile
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serverutil import PagodaServer  # noqa: E402

BINARY, SMOL = sys.argv[1], sys.argv[2]
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
QWEN3 = os.path.join(ROOT, "tests", "tok", "fixtures", "templates", "Qwen-Qwen3-0.6B.jinja")
BLOCK = 16

# The assistant's first reply as the client sends it back: a reasoning block, then
# an answer a 135M model does not start its reply with.
CONV = [
    {"role": "system", "content": "You are a helpful assistant. Answer in one short sentence."},
    {"role": "user", "content": "Name an animal with stripes."},
    {"role": "assistant", "content": "<think>\nThe user wants a striped animal. Zebras have stripes.\n</think>\n\n"
                                     "Zebras have black and white stripes."},
    {"role": "user", "content": "Where do they live? Please answer with the continent and one country there."},
]


def check(args):
    return subprocess.run([BINARY, "template", "--check-prefix-stability"] + args, capture_output=True, text=True,
                          timeout=120)


def metric(text, cause):
    m = re.search(r'^pagoda:prefix_cache_miss_total\{[^}]*cause="%s"[^}]*\} (\S+)$' % cause, text, re.M)
    return float(m.group(1)) if m else None


class PrefixMissE2E(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.conv = os.path.join(cls.tmp.name, "conv.json")
        with open(cls.conv, "w") as f:
            json.dump(CONV, f)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_checker_and_server_agree(self):
        r = check(["-m", SMOL, "--template", QWEN3, "--messages", self.conv, "--json"])
        self.assertEqual(r.returncode, 3, r.stderr)
        rep = json.loads(r.stdout)
        self.assertEqual(rep["turns"], 2)
        self.assertFalse(rep["stable"])
        self.assertEqual(len(rep["breaks"]), 1)
        br = rep["breaks"][0]
        self.assertEqual(br["turn"], 1)
        self.assertTrue(br["prev"].startswith("<think>"), br)
        self.assertTrue(br["next"].startswith("Zebras have"), br)
        self.assertTrue(br["context"].endswith("<|im_start|>assistant\n"), br)
        position = br["token"]
        self.assertIsInstance(position, int)
        # The human-readable report names the same byte and token.
        text = check(["-m", SMOL, "--template", QWEN3, "--messages", self.conv])
        self.assertEqual(text.returncode, 3)
        self.assertIn("turn 2's prompt stops extending turn 1's rendering at byte %d, token %d" % (br["byte"], position),
                      text.stdout)

        with PagodaServer(BINARY, SMOL, ["--chat-template", QWEN3, "--block-size", str(BLOCK)]) as srv:
            with urllib.request.urlopen(srv.url + "/v1/models", timeout=30) as resp:
                model = json.loads(resp.read())["data"][0]["id"]

            def chat(messages, max_tokens):
                body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
                        "ignore_eos": True}
                req = urllib.request.Request(srv.url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                             headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=300) as resp:
                    return resp.status, resp.headers, json.loads(resp.read())

            # Turn 1: its prompt ends at `position`; 2 blocks of reply commit the block holding it.
            status, headers, first = chat(CONV[:2], 2 * BLOCK)
            self.assertEqual(status, 200)
            self.assertEqual(first["usage"]["prompt_tokens"], position)
            self.assertEqual(headers["x-pagoda-prefix"], "matched=0; cause=never_seen")
            # The model did not happen to write the answer turn 2 sends back.
            self.assertFalse(first["choices"][0]["message"]["content"].startswith("Zebras"))
            before = urllib.request.urlopen(srv.url + "/metrics", timeout=30).read().decode()

            status, headers, second = chat(CONV, 1)
            self.assertEqual(status, 200)
            matched = position // BLOCK * BLOCK
            want = "matched=%d; cause=diverged; position=%d" % (matched, position)
            self.assertEqual(headers["x-pagoda-prefix"], want)
            self.assertEqual(second["usage"]["prompt_tokens_details"]["cached_tokens"], matched)
            after = urllib.request.urlopen(srv.url + "/metrics", timeout=30).read().decode()
            self.assertEqual(metric(after, "diverged"), metric(before, "diverged") + 1)
            self.assertEqual(metric(after, "never_seen"), 1)
            for cause in ("evicted", "salt", "tier_miss"):
                self.assertEqual(metric(after, cause), 0, cause)
            # The access line is written as the response ends: give the log reader a moment.
            deadline = time.time() + 30
            while True:
                line = [ln for ln in srv.log if second["id"] in ln and "status=200" in ln]
                if line or time.time() > deadline:
                    break
                time.sleep(0.05)
            self.assertEqual(len(line), 1, "".join(srv.log[-20:]))
            self.assertIn(' prefix="%s"' % want, line[0])

    def test_stable_conversation_exits_zero(self):
        stable = os.path.join(self.tmp.name, "stable.json")
        conv = [dict(m) for m in CONV]
        conv[2]["content"] = "Zebras have black and white stripes."
        with open(stable, "w") as f:
            json.dump(conv, f)
        # SmolLM2's own template (ChatML) renders every turn as the next prompt does.
        r = check(["-m", SMOL, "--messages", stable])
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("2 turns: every prompt extends the previous turn", r.stdout)

    def test_bad_input_is_a_clear_error(self):
        bad = os.path.join(self.tmp.name, "bad.json")
        with open(bad, "w") as f:
            f.write("[{\"role\": ")
        cases = [
            (["--template", QWEN3, "--messages", os.path.join(self.tmp.name, "missing.json")], "cannot read"),
            (["--template", QWEN3, "--messages", bad], "is not valid JSON"),
            (["--template", os.path.join(self.tmp.name, "none.jinja"), "--messages", self.conv], "cannot read"),
            (["--model", os.path.join(ROOT, "tests", "data", "stories260K.gguf"), "--messages", self.conv],
             "no tokenizer.chat_template"),
        ]
        for args, msg in cases:
            r = check(args)
            self.assertEqual(r.returncode, 1, (args, r.stdout, r.stderr))
            self.assertIn(msg, r.stderr, args)


if __name__ == "__main__":
    if not os.path.exists(SMOL):
        if os.environ.get("CI") == "true":
            sys.exit(f"{SMOL} not found (CI must not skip)")
        print(f"skipped: {SMOL} not found")
        sys.exit(77)
    unittest.main(argv=sys.argv[:1], verbosity=2)
