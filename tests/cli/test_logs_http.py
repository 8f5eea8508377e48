"""Issue 20: the server's log (timestamps and levels, one access line per request, the
periodic vLLM-style stats line, one warning per ignored request field) and its HTTP
details (CORS preflight and headers, /version, max_completion_tokens on completions,
llama-server's /tokenize {"content"} shape).
Usage: test_logs_http.py PAGODA DATA_DIR
"""
import json
import os
import re
import sys
import time
import unittest
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clitest import Launched  # noqa: E402

BINARY, DATA = sys.argv[1], sys.argv[2]
MODEL = os.path.join(DATA, "stories260K.gguf")
ORIGIN = "http://app.example"

STAMP = r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} (debug|info|warning|error)\s+"
ACCESS = (r"(cmpl-[0-9a-f]{16}) /v1/completions status=200 prompt_tokens=(\d+) output_tokens=4 cached_tokens=(\d+) "
          r"ttft=\d+\.\d{3}s duration=\d+\.\d{3}s finish=length "
          r"prefix=\"matched=\d+; cause=(?:none|never_seen)\"$")  # issue 36: why its prefix hit ended
STATS = (r"Avg prompt throughput: \d+\.\d tokens/s, Avg generation throughput: \d+\.\d tokens/s, Running: \d+ reqs, "
         r"Waiting: \d+ reqs, GPU KV cache usage: \d+\.\d%, Prefix cache hit rate: \d+\.\d%$")


class LogsAndHttp(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.srv = Launched(BINARY, ["serve", MODEL, "--port", "0", "-c", "256", "--log-stats-interval", "0.5",
                                    "--allowed-origins", ORIGIN])
        assert cls.srv.port, cls.srv.text()

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()

    def raw(self, method, path, body=None, headers=None):
        req = urllib.request.Request(f"http://127.0.0.1:{self.srv.port}{path}", method=method,
                                     data=None if body is None else json.dumps(body).encode(), headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, dict(r.headers), r.read()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read()

    def test_access_stats_and_ignored_field_lines(self):
        ids = []
        for _ in range(2):
            r = self.srv.post("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0,
                                                  "user": "u1", "suffix": "x"})
            ids.append(r["id"])
        deadline = time.time() + 10
        while time.time() < deadline and not any(re.search(STATS, x) for x in self.srv.log):
            time.sleep(0.1)
        lines = list(self.srv.log)
        for line in lines:
            self.assertRegex(line, STAMP)  # every line: timestamp and level
        access = [m for m in (re.search(ACCESS, x) for x in lines) if m]
        self.assertEqual([m.group(1) for m in access if m.group(1) in ids], ids)  # one line each, in order
        for m in access:
            self.assertEqual(int(m.group(2)), 5)  # BOS + 4 prompt tokens
        stats = [x for x in lines if re.search(STATS, x)]
        self.assertGreaterEqual(len(stats), 1, "".join(lines))
        self.assertRegex(stats[0], r" info\s+Avg prompt throughput")
        # Exactly one warning per ignored field name, for two requests that sent them.
        for field in ("user", "suffix"):
            warn = [x for x in lines if f"request field '{field}' is not supported" in x]
            self.assertEqual(len(warn), 1, field)
            self.assertRegex(warn[0], r" warning ")
        # An idle server stays quiet: no stats line while nothing happens.
        time.sleep(1.2)
        n = sum(1 for x in self.srv.log if re.search(STATS, x))
        time.sleep(1.2)
        self.assertEqual(sum(1 for x in self.srv.log if re.search(STATS, x)), n)

    def test_cors(self):
        pre = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
               "Access-Control-Request-Headers": "authorization, content-type"}
        status, headers, body = self.raw("OPTIONS", "/v1/chat/completions", headers=pre)
        self.assertEqual(status, 204)
        self.assertEqual(body, b"")
        self.assertEqual(headers["Access-Control-Allow-Origin"], ORIGIN)
        self.assertIn("POST", headers["Access-Control-Allow-Methods"])
        self.assertEqual(headers["Access-Control-Allow-Headers"], "authorization, content-type")
        status, headers, _ = self.raw("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 1},
                                      {"Origin": ORIGIN, "Content-Type": "application/json"})
        self.assertEqual(status, 200)
        self.assertEqual(headers["Access-Control-Allow-Origin"], ORIGIN)
        # Another origin gets no grant (the browser then refuses), on the preflight and the call.
        status, headers, _ = self.raw("OPTIONS", "/v1/completions", headers=dict(pre, Origin="http://evil.example"))
        self.assertEqual(status, 204)
        self.assertNotIn("Access-Control-Allow-Origin", headers)
        status, headers, _ = self.raw("GET", "/health", headers={"Origin": "http://evil.example"})
        self.assertEqual(status, 200)
        self.assertNotIn("Access-Control-Allow-Origin", headers)

    def test_version(self):
        status, _, body = self.raw("GET", "/version")
        self.assertEqual(status, 200)
        self.assertRegex(json.loads(body)["version"], r"^\d+\.\d+\.\d+ \(commit ")

    def test_max_completion_tokens_on_completions(self):
        r = self.srv.post("/v1/completions", {"prompt": "Once upon a time", "max_completion_tokens": 3,
                                              "temperature": 0})
        self.assertEqual(r["usage"]["completion_tokens"], 3)
        self.assertEqual(r["choices"][0]["finish_reason"], "length")

    def test_tokenize_content_shape(self):
        a = self.srv.post("/tokenize", {"prompt": "Once upon a time"})
        b = self.srv.post("/tokenize", {"content": "Once upon a time"})
        self.assertEqual(a["tokens"], b["tokens"])
        self.assertEqual(len(b["tokens"]), 5)
        c = self.srv.post("/tokenize", {"content": "Once upon a time", "add_special": False})
        self.assertEqual(c["tokens"], b["tokens"][1:])
        d = self.srv.post("/detokenize", {"tokens": c["tokens"]})
        self.assertEqual(d["content"], d["prompt"])
        self.assertIn("upon a time", d["content"])


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v"])
