#!/usr/bin/env python3
"""Malformed-request corpus against a real `pagoda serve`: every case gets the
right status and the OpenAI error shape, and the server keeps serving after.
Also: API key checks, 503 on an over-full queue, client disconnects free blocks.

Usage: test_malformed.py PAGODA_BINARY TEST_DATA_DIR
"""
import http.client
import json
import os
import socket
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from serverutil import OneServerPerClass, PagodaServer, raw_exchange  # noqa: E402

BINARY, DATA = sys.argv[1], sys.argv[2]
STORIES = os.path.join(DATA, "stories260K.gguf")


def request(port, method, path, body=None, headers=None, raw=None, timeout=60):
    if raw is not None:
        s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        s.sendall(raw)
        data = b""
        while True:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            if not chunk:
                break
            data += chunk
            if b"\r\n\r\n" in data:
                head, _, rest = data.partition(b"\r\n\r\n")
                length = [int(l.split(b":")[1]) for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")]
                if length and len(rest) >= length[0]:
                    break
        s.close()
        status = int(data.split(b" ")[1]) if data.startswith(b"HTTP/1.1") else 0
        return status, data.partition(b"\r\n\r\n")[2]
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
    c.request(method, path, body=body, headers=headers or {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


def post(port, path, body):
    status, data = request(port, "POST", path, body=body)
    if status != 200:
        raise AssertionError(f"{status}: {data[:300]!r}")
    return json.loads(data)


C, CH = "/v1/completions", "/v1/chat/completions"
OK_C = {"prompt": "Once upon a time", "max_tokens": 2}
CASES = [
    # (name, method, path, body, expected status)
    ("invalid json", "POST", C, "{not json", 400),
    ("empty body", "POST", C, "", 400),
    ("json array body", "POST", C, "[1,2]", 400),
    ("json string body", "POST", C, '"hi"', 400),
    ("truncated json", "POST", C, '{"prompt": "a"', 400),
    ("missing prompt", "POST", C, {"max_tokens": 2}, 400),
    ("prompt null", "POST", C, {"prompt": None}, 400),
    ("prompt number", "POST", C, {"prompt": 5}, 400),
    ("prompt empty list", "POST", C, {"prompt": []}, 400),
    ("prompt mixed list", "POST", C, {"prompt": ["a", 3]}, 400),
    ("prompt nested bad", "POST", C, {"prompt": [[1, "x"]]}, 400),
    ("prompt negative token", "POST", C, {"prompt": [1, -5]}, 400),
    ("prompt token past vocab", "POST", C, {"prompt": [1, 100000]}, 400),
    ("prompt huge token", "POST", C, {"prompt": [1, 2**64]}, 400),
    ("max_tokens string", "POST", C, dict(OK_C, max_tokens="5"), 400),
    ("max_tokens float", "POST", C, dict(OK_C, max_tokens=2.5), 400),
    ("max_tokens negative", "POST", C, dict(OK_C, max_tokens=-1), 400),
    ("max_tokens zero", "POST", C, dict(OK_C, max_tokens=0), 400),
    ("max_tokens huge", "POST", C, dict(OK_C, max_tokens=10**30), 400),
    ("max_tokens past context", "POST", C, dict(OK_C, max_tokens=600), 400),
    ("temperature negative", "POST", C, dict(OK_C, temperature=-1), 400),
    ("temperature huge", "POST", C, dict(OK_C, temperature=1e308), 400),
    ("temperature string", "POST", C, dict(OK_C, temperature="hot"), 400),
    ("top_p zero", "POST", C, dict(OK_C, top_p=0), 400),
    ("top_p above one", "POST", C, dict(OK_C, top_p=1.5), 400),
    ("top_k float", "POST", C, dict(OK_C, top_k=1.5), 400),
    ("min_p negative", "POST", C, dict(OK_C, min_p=-0.1), 400),
    ("n zero", "POST", C, dict(OK_C, n=0), 400),
    ("n huge", "POST", C, dict(OK_C, n=1000), 400),
    ("seed string", "POST", C, dict(OK_C, seed="x"), 400),
    ("stop number", "POST", C, dict(OK_C, stop=5), 400),
    ("stop list of numbers", "POST", C, dict(OK_C, stop=[1, 2]), 400),
    ("presence penalty out of range", "POST", C, dict(OK_C, presence_penalty=3), 400),
    ("frequency penalty string", "POST", C, dict(OK_C, frequency_penalty="a"), 400),
    ("logprobs too many", "POST", C, dict(OK_C, logprobs=50), 400),
    ("echo string", "POST", C, dict(OK_C, echo="yes"), 400),
    ("stream string", "POST", C, dict(OK_C, stream="yes"), 400),
    ("stream_options without stream", "POST", C, dict(OK_C, stream_options={"include_usage": True}), 400),
    ("unknown model", "POST", C, dict(OK_C, model="gpt-9"), 404),
    ("chat missing messages", "POST", CH, {"max_tokens": 2}, 400),
    ("chat empty messages", "POST", CH, {"messages": []}, 400),
    ("chat messages not list", "POST", CH, {"messages": "hi"}, 400),
    ("chat message not object", "POST", CH, {"messages": ["hi"]}, 400),
    ("chat unknown role", "POST", CH, {"messages": [{"role": "wizard", "content": "hi"}]}, 400),
    ("chat role missing", "POST", CH, {"messages": [{"content": "hi"}]}, 400),
    ("chat content number", "POST", CH, {"messages": [{"role": "user", "content": 5}]}, 400),
    ("chat image part", "POST", CH, {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400),
    ("chat top_logprobs without logprobs", "POST", CH,
     {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, 400),
    ("chat max_completion_tokens negative", "POST", CH,
     {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": -3}, 400),
    ("invalid utf-8", "POST", C, b'{"prompt": "\xff\xfe bad"}', 400),
    ("unknown path", "GET", "/v2/everything", None, 404),
    ("unknown post path", "POST", "/v1/embeddings", {}, 404),
    ("wrong method completions", "GET", C, None, 405),
    ("wrong method models", "POST", "/v1/models", {}, 405),
    ("wrong method health", "DELETE", "/health", None, 405),
    # Issue 17: per-request cost bounds (each names its limit).
    ("stop string past 1 KiB", "POST", C, dict(OK_C, stop="x" * 1025), 400),
    ("stop list entry past 1 KiB", "POST", C, dict(OK_C, stop=["a", "y" * 1025]), 400),
    ("17 stop strings", "POST", C, dict(OK_C, stop=[str(i) for i in range(17)]), 400),
    ("issue 17 request: 16 x 16 KB stops, 64 prompts, n 16", "POST", C,
     {"prompt": ["Once"] * 64, "n": 16, "stop": [chr(97 + i) * 16384 for i in range(16)]}, 400),
    ("cache_salt past 256 bytes", "POST", C, dict(OK_C, cache_salt="s" * 257), 400),
    ("cache_salt number", "POST", C, dict(OK_C, cache_salt=5), 400),
    ("65 prompts", "POST", C, dict(OK_C, prompt=["a"] * 65), 400),
    ("prompts x n past 256 choices", "POST", C, {"prompt": ["a"] * 64, "n": 16, "max_tokens": 1}, 400),
    ("prompts x n x max_tokens x logprobs", "POST", C,
     {"prompt": ["a"] * 8, "n": 16, "max_tokens": 2000, "logprobs": 20}, 400),
    ("json nested 100 deep", "POST", C, '{"prompt": ' + "[" * 100 + "]" * 100 + "}", 400),
    ("json nested 200k deep", "POST", C, '{"prompt": ' + "[" * 200000 + "]" * 200000 + "}", 400),
    ("chat content nested deep", "POST", CH, '{"messages": [{"role": "user", "content": ' + "[" * 64 + "]" * 64 + "}]}",
     400),
    ("tokenize nested deep", "POST", "/tokenize", '{"prompt": ' + "{\"a\":" * 64 + "1" + "}" * 64 + "}", 400),
    ("detokenize nested deep", "POST", "/detokenize", '{"tokens": ' + "[" * 64 + "]" * 64 + "}", 400),
    ("tokenize without prompt", "POST", "/tokenize", {}, 400),
    ("detokenize bad tokens", "POST", "/detokenize", {"tokens": ["a"]}, 400),
    ("detokenize past vocab", "POST", "/detokenize", {"tokens": [10**6]}, 400),
]

# Issue 35 item 7: fields that were accepted and ignored. Each is refused with a 400
# naming the field (param): (name, path, body, param).
REFUSED_FIELDS = [
    ("guided_grammar with an undefined rule", C, dict(OK_C, guided_grammar='root ::= "yes" | answer'),
     "guided_grammar"),
    ("guided_grammar without root", C, dict(OK_C, guided_grammar='a ::= "a"'), "guided_grammar"),
    ("chat guided_grammar not a string", CH, {"messages": [{"role": "user", "content": "hi"}], "guided_grammar": 5},
     "guided_grammar"),
    ("guided_grammar not a string", C, dict(OK_C, guided_grammar=["root"]), "guided_grammar"),
    ("guided_grammar left-recursive", C, dict(OK_C, guided_grammar='root ::= root "a" | "a"'), "guided_grammar"),
    ("best_of above n", C, dict(OK_C, best_of=3), "best_of"),
    ("best_of above n = 2", C, dict(OK_C, best_of=3, n=2), "best_of"),
    ("best_of string", C, dict(OK_C, best_of="2"), "best_of"),
    ("logit_bias past the vocabulary (512 tokens)", C, dict(OK_C, logit_bias={"512": 5}), "logit_bias"),
    ("chat logit_bias past the vocabulary", CH,
     {"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"100000": -5}}, "logit_bias"),
    ("logit_bias negative id", C, dict(OK_C, logit_bias={"-1": 5}), "logit_bias"),
    ("logit_bias id not a number", C, dict(OK_C, logit_bias={"abc": 5}), "logit_bias"),
    ("logit_bias value past 100", C, dict(OK_C, logit_bias={"5": 101}), "logit_bias"),
    ("logit_bias value a string", C, dict(OK_C, logit_bias={"5": "x"}), "logit_bias"),
    ("logit_bias a list", C, dict(OK_C, logit_bias=[5]), "logit_bias"),
]


class Malformed(OneServerPerClass, unittest.TestCase):
    SERVER = (BINARY, STORIES, ["--num-kv-blocks", "128"])

    def check_error_shape(self, body, status):
        err = json.loads(body)["error"]
        for k in ("message", "type", "param", "code"):
            self.assertIn(k, err)
        self.assertTrue(err["message"])

    def test_corpus(self):
        self.assertGreaterEqual(len(CASES), 40)
        for name, method, path, body, want in CASES:
            with self.subTest(name=name):
                if isinstance(body, bytes):
                    status, data = request(self.srv.port, method, path, body=body)
                else:
                    status, data = request(self.srv.port, method, path, body=body)
                self.assertEqual(status, want, f"{name}: {data[:300]!r}")
                self.check_error_shape(data, status)
        # Still serving afterwards.
        status, data = request(self.srv.port, "POST", C, OK_C)
        self.assertEqual(status, 200, data)

    def test_ignored_fields_are_refused(self):
        before = self.srv.metrics()["pagoda:prompt_tokens_total"]
        for name, path, body, param in REFUSED_FIELDS:
            with self.subTest(name=name):
                status, data = request(self.srv.port, "POST", path, body=body)
                self.assertEqual(status, 400, f"{name}: {data[:300]!r}")
                self.assertEqual(json.loads(data)["error"]["param"], param, data[:300])
        # Refused before the engine: nothing was prefilled.
        self.assertEqual(self.srv.metrics()["pagoda:prompt_tokens_total"], before)
        # best_of equal to n is what vLLM does without best_of: accepted.
        status, data = request(self.srv.port, "POST", C, dict(OK_C, best_of=2, n=2))
        self.assertEqual(status, 200, data[:300])
        self.assertEqual(len(json.loads(data)["choices"]), 2)

    def test_logit_bias_forces_a_token(self):
        # Greedy and sampled: +100 on one id beats every logit of stories260K, so every
        # output token is that id; without the bias greedy picks others.
        plain = post(self.srv.port, C, {"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0,
                                        "return_token_ids": True, "ignore_eos": True})
        forced = 57
        self.assertNotEqual(set(plain["choices"][0]["token_ids"]), {forced})
        for extra in ({"temperature": 0}, {"temperature": 1.0, "seed": 3}, {"temperature": 0, "logprobs": 2}):
            with self.subTest(**extra):
                out = post(self.srv.port, C, dict({"prompt": "Once upon a time", "max_tokens": 6, "ignore_eos": True,
                                                   "return_token_ids": True, "logit_bias": {str(forced): 100}},
                                                  **extra))
                self.assertEqual(out["choices"][0]["token_ids"], [forced] * 6)
        # A large negative bias on greedy's first pick moves it elsewhere.
        first = plain["choices"][0]["token_ids"][0]
        out = post(self.srv.port, C, {"prompt": "Once upon a time", "max_tokens": 1, "temperature": 0,
                                      "return_token_ids": True, "logit_bias": {str(first): -100}})
        self.assertNotEqual(out["choices"][0]["token_ids"][0], first)

    def test_guided_grammar_constrains_the_output(self):
        import re
        grammar = 'root ::= answer " " [a-c]{2,3} "."\nanswer ::= "yes" | "no"  # GBNF, as vLLM takes it\n'
        for path, body in ((C, {"prompt": "Once upon a time"}),):  # stories260K has no chat template
            for extra in ({"temperature": 0}, {"temperature": 1.0, "seed": 5}):
                with self.subTest(path=path, **extra):
                    out = post(self.srv.port, path, dict(body, max_tokens=40, guided_grammar=grammar, **extra))
                    ch = out["choices"][0]
                    text = ch["text"] if path == C else ch["message"]["content"]
                    self.assertRegex(text, r"^(yes|no) [a-c]{2,3}\.$")
                    self.assertEqual(ch["finish_reason"], "stop")

    def test_transfer_encoding_other_than_chunked(self):
        body = json.dumps(OK_C).encode()
        chunked = hex(len(body))[2:].encode() + b"\r\n" + body + b"\r\n0\r\n\r\n"
        for te in (b"gzip, chunked", b"identity, chunked", b"chunked, chunked", b"gzip"):
            with self.subTest(te=te):
                raw = (f"POST {C} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n".encode() +
                       b"Transfer-Encoding: " + te + b"\r\n\r\n" + chunked)
                status, data = request(self.srv.port, None, None, raw=raw)
                self.assertEqual(status, 400, data[:300])
                self.assertEqual(json.loads(data)["error"]["param"], "Transfer-Encoding")
        for te in (b"chunked", b"Chunked"):
            with self.subTest(te=te):
                raw = (f"POST {C} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n".encode() +
                       b"Transfer-Encoding: " + te + b"\r\nConnection: close\r\n\r\n" + chunked)
                out = raw_exchange(self.srv.port, raw)
                self.assertTrue(out.startswith(b"HTTP/1.1 200"), out[:300])

    def test_obs_fold_header(self):
        body = json.dumps(OK_C)
        for fold in (" ", "\t"):
            with self.subTest(fold=repr(fold)):
                raw = (f"POST {C} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Note: a\r\n{fold}b\r\n"
                       f"Content-Length: {len(body)}\r\n\r\n{body}").encode()
                status, data = request(self.srv.port, None, None, raw=raw)
                self.assertEqual(status, 400, data[:300])
                self.assertIn("obs-fold", json.loads(data)["error"]["message"])
        # Whitespace inside a value is not a fold.
        raw = (f"POST {C} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Note: a \t b\r\n"
               f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}").encode()
        self.assertTrue(raw_exchange(self.srv.port, raw).startswith(b"HTTP/1.1 200"))

    def test_body_limit(self):
        # Announce a 10 MiB body and send only its start: the server must refuse on the header.
        n = 10 * 1024 * 1024
        raw = (f"POST {C} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               f"Content-Length: {n}\r\n\r\n").encode() + b'{"prompt": "' + b"a" * 60000
        status, data = request(self.srv.port, None, None, raw=raw)
        self.assertEqual(status, 413, data[:200])
        self.check_error_shape(data, status)
        self.assertEqual(request(self.srv.port, "GET", "/health")[0], 200)

    def test_garbage_http(self):
        status, _ = request(self.srv.port, None, None, raw=b"NOT HTTP AT ALL\r\n\r\n")
        self.assertIn(status, (0, 400))
        status, _ = request(self.srv.port, None, None, raw=b"\x00\x01\x02\x03" * 100)
        self.assertIn(status, (0, 400))
        self.assertEqual(request(self.srv.port, "GET", "/health")[0], 200)

    def test_disconnect_frees_blocks(self):
        s = socket.create_connection(("127.0.0.1", self.srv.port))
        body = json.dumps({"prompt": "Once upon a time", "max_tokens": 400, "stream": True, "ignore_eos": True})
        s.sendall(f"POST {C} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(body)}\r\n\r\n{body}".encode())
        s.recv(4096)
        s.close()
        # The abort lands at the next write after the close; on a 2-core machine shared with
        # other test processes (CI's -j2) one step can stall for seconds, so wait long.
        deadline = time.time() + 120
        while time.time() < deadline:
            m = self.srv.metrics()
            if m["pagoda:num_requests_running"] == 0 and m["pagoda:num_requests_waiting"] == 0:
                break
            time.sleep(0.05)
        m = self.srv.metrics()
        self.assertEqual(m["pagoda:num_requests_running"], 0)
        self.assertEqual(m["pagoda:kv_cache_usage_perc"], 0)


class HttpDetails(OneServerPerClass, unittest.TestCase):
    SERVER = (BINARY, STORIES, ["--num-kv-blocks", "64"])

    def test_head_has_headers_and_no_body(self):
        for path in ("/health", "/v1/models", "/metrics"):
            with self.subTest(path=path):
                out = raw_exchange(self.srv.port, f"HEAD {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
                head, _, body = out.partition(b"\r\n\r\n")
                self.assertTrue(head.startswith(b"HTTP/1.1 200"), head)
                length = [int(l.split(b":")[1]) for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")]
                self.assertTrue(length and length[0] > 0, head)  # the GET's length
                self.assertEqual(body, b"")

    def test_half_closed_client_gets_its_answer(self):
        for stream in (False, True):
            with self.subTest(stream=stream):
                body = json.dumps({"prompt": "Once upon a time", "max_tokens": 5, "temperature": 0, "stream": stream})
                req = (f"POST {C} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       f"Content-Length: {len(body)}\r\n\r\n{body}").encode()
                out = raw_exchange(self.srv.port, req, half_close=True)
                self.assertTrue(out.startswith(b"HTTP/1.1 200"), out[:300])
                if stream:
                    self.assertIn(b"data: [DONE]", out)
                else:
                    payload = json.loads(out.partition(b"\r\n\r\n")[2])
                    self.assertEqual(payload["usage"]["completion_tokens"], 5)
        self.assertEqual(request(self.srv.port, "GET", "/health")[0], 200)


class ApiKeyAndQueue(unittest.TestCase):
    def test_key_on_every_data_route(self):
        with PagodaServer(BINARY, STORIES, ["--api-key", "k1,sekret", "--num-kv-blocks", "64"]) as srv:
            routes = [("POST", "/tokenize", {"prompt": "hi"}), ("POST", "/detokenize", {"tokens": [1]}),
                      ("GET", "/metrics", None), ("GET", "/v1/models", None), ("POST", C, OK_C)]
            for method, path, body in routes:
                with self.subTest(path=path):
                    st, data = request(srv.port, method, path, body=body)
                    self.assertEqual(st, 401, data[:200])
                    self.assertEqual(json.loads(data)["error"]["type"], "authentication_error")
                    for auth in ("Bearer sekret", "bearer sekret", "BEARER   k1"):
                        st, data = request(srv.port, method, path, body=body,
                                           headers={"Authorization": auth, "Content-Type": "application/json"})
                        self.assertEqual(st, 200, (auth, data[:200]))
                    st, _ = request(srv.port, method, path, body=body,
                                    headers={"Authorization": "Basic sekret", "Content-Type": "application/json"})
                    self.assertEqual(st, 401)
            self.assertEqual(request(srv.port, "GET", "/health")[0], 200)  # liveness stays open

    def test_metrics_without_key_flag(self):
        with PagodaServer(BINARY, STORIES, ["--api-key", "sekret", "--metrics-without-key", "--num-kv-blocks", "64"]) as srv:
            self.assertEqual(request(srv.port, "GET", "/metrics")[0], 200)
            self.assertEqual(request(srv.port, "POST", "/tokenize", {"prompt": "hi"})[0], 401)

    def test_api_key(self):
        with PagodaServer(BINARY, STORIES, ["--api-key", "sekret", "--num-kv-blocks", "64"]) as srv:
            self.assertEqual(request(srv.port, "POST", C, OK_C)[0], 401)
            st, body = request(srv.port, "POST", C, OK_C, headers={"Authorization": "Bearer wrong"})
            self.assertEqual(st, 401)
            self.assertEqual(json.loads(body)["error"]["type"], "authentication_error")
            st, _ = request(srv.port, "POST", C, OK_C,
                            headers={"Authorization": "Bearer sekret", "Content-Type": "application/json"})
            self.assertEqual(st, 200)
            self.assertEqual(request(srv.port, "GET", "/health")[0], 200)

    def test_max_waiting_503(self):
        with PagodaServer(BINARY, STORIES, ["--max-waiting", "0", "--max-num-seqs", "1", "--num-kv-blocks", "64"]) as srv:
            results = []

            def go():
                results.append(request(srv.port, "POST", C, {"prompt": "Once", "max_tokens": 300, "ignore_eos": True}))
            threads = [threading.Thread(target=go) for _ in range(6)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            statuses = sorted(s for s, _ in results)
            self.assertIn(503, statuses)
            self.assertIn(200, statuses)


class Burst(unittest.TestCase):
    """Issue 35 item 2: a burst far above the worker threads is queued, not refused.
    200 concurrent streamed requests at the default limits (--max-waiting 1024), 30%
    of them dropped after their first event: no 503, every kept stream ends in [DONE],
    and the dropped ones are aborted (nothing left running)."""

    def test_200_concurrent_streams_get_no_503(self):
        with PagodaServer(BINARY, STORIES, []) as srv:
            n = 200
            results = [None] * n
            start = threading.Barrier(n)

            def go(i):
                drop = i % 10 < 3
                body = json.dumps({"prompt": "Once upon a time", "max_tokens": 8 if not drop else 64,
                                   "ignore_eos": True, "stream": True, "temperature": 0})
                req = (f"POST {C} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}").encode()
                start.wait()
                s = socket.create_connection(("127.0.0.1", srv.port), timeout=300)
                try:
                    s.sendall(req)
                    data = b""
                    while True:
                        chunk = s.recv(65536)
                        if not chunk:
                            break
                        data += chunk
                        if drop and b"data: {" in data:
                            break  # went away mid-stream
                    results[i] = (drop, data)
                finally:
                    s.close()

            threads = [threading.Thread(target=go, args=(i,)) for i in range(n)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            statuses = [int(d.split(b" ")[1]) if d.startswith(b"HTTP/1.1") else 0 for _, d in results]
            self.assertEqual(statuses.count(503), 0, [d[:200] for _, d in results if b" 503 " in d[:20]][:3])
            self.assertEqual(statuses, [200] * n)
            for drop, data in results:
                if not drop:
                    self.assertIn(b"data: [DONE]", data)
            deadline = time.time() + 60
            while time.time() < deadline:
                m = srv.metrics()
                if m["pagoda:num_requests_running"] == 0 and m["pagoda:num_requests_waiting"] == 0:
                    break
                time.sleep(0.1)
            m = srv.metrics()
            self.assertEqual(m["pagoda:num_requests_running"], 0)
            self.assertEqual(m["pagoda:num_requests_waiting"], 0)
            self.assertEqual(m["pagoda:kv_cache_usage_perc"], 0)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v"])
