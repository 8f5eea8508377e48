#!/usr/bin/env python3
"""The Anthropic Messages API and the new OpenAI cache/priority fields through
`pagoda serve`, driven by the official `anthropic` SDK (issue 36).

Usage: test_anthropic_e2e.py PAGODA_BINARY DEFAULT_MODEL
Checks messages.create (greedy text equal to /v1/chat/completions'), messages.stream
(Anthropic's event order), stop sequences and max_tokens, a forced tool_use whose
input validates against the tool's schema (streamed and not), count_tokens equal to
the prompt's tokens, cache_control usage against the server's prefix-cache counters,
and errors in Anthropic's shape. Skips (exit 77) when the model file or the Python
packages are missing, except under CI=true, where that fails.
"""
import json
import os
import sys
import time
import unittest
import urllib.request
import uuid


def skip(why):
    print(f"skipped: {why}")
    sys.exit(1 if os.environ.get("CI") == "true" else 77)


try:
    import anthropic
    import jsonschema
except ImportError as e:  # scripts/setup installs both
    skip(e)

sys.path.insert(0, os.path.dirname(__file__))
from serverutil import OneServerPerClass  # noqa: E402

BINARY, SMOL = sys.argv[1], sys.argv[2]
if not os.path.exists(SMOL):
    skip(f"{SMOL} not found")

KEY = "sk-test-anthropic"
WEATHER = {"type": "object",
           "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"]}
TOOLS = [{"name": "get_weather", "description": "The current weather in a city", "input_schema": WEATHER},
         {"name": "get_time", "description": "The local time in a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
HELLO = [{"role": "user", "content": "Write one sentence about the sea."}]


def post(url, body, headers=None):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


class Messages(OneServerPerClass, unittest.TestCase):
    SERVER = (BINARY, SMOL, ["--served-model-name", "smol", "--api-key", KEY, "--metrics-without-key"])

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.client = anthropic.Anthropic(base_url=cls.srv.url, api_key=KEY, max_retries=0, timeout=300)

    def create(self, **kw):
        kw.setdefault("model", "smol")
        kw.setdefault("max_tokens", 24)
        # This SDK version has no temperature argument any more: the field goes in the body.
        kw.setdefault("extra_body", {"temperature": 0})
        return self.client.messages.create(**kw)

    def prompt_tokens(self, u):
        return u.input_tokens + u.cache_creation_input_tokens + u.cache_read_input_tokens

    def hits(self):
        m = self.srv.metrics()
        return m.get("pagoda:prefix_cache_hits_total", 0.0), m.get("pagoda:prefix_cache_queries_total", 0.0)

    def settled_hits(self, queries_before, prompt_tokens):
        """The prefix-cache counters once the engine has published the request's step
        (the response may reach the client a moment before the stats)."""
        deadline = time.time() + 10
        while True:
            h, q = self.hits()
            if q >= queries_before + prompt_tokens or time.time() > deadline:
                return h, q
            time.sleep(0.05)

    def test_create_matches_chat_completions(self):
        r = self.create(messages=HELLO)
        self.assertTrue(r.id.startswith("msg_"), r.id)
        self.assertEqual((r.type, r.role, r.model), ("message", "assistant", "smol"))
        self.assertEqual(len(r.content), 1)
        self.assertEqual(r.content[0].type, "text")
        self.assertIn(r.stop_reason, ("end_turn", "max_tokens"))
        # The same template path: greedy text and token counts equal the chat endpoint's.
        st, c = post(self.srv.url + "/v1/chat/completions",
                     {"model": "smol", "messages": HELLO, "max_tokens": 24, "temperature": 0},
                     {"Authorization": "Bearer " + KEY})
        self.assertEqual(st, 200, c)
        self.assertEqual(r.content[0].text, c["choices"][0]["message"]["content"])
        self.assertEqual(self.prompt_tokens(r.usage), c["usage"]["prompt_tokens"])
        self.assertEqual(r.usage.output_tokens, c["usage"]["completion_tokens"])
        self.assertEqual(r.stop_reason, "max_tokens" if c["choices"][0]["finish_reason"] == "length" else "end_turn")
        # count_tokens: the exact prompt length.
        n = self.client.messages.count_tokens(model="smol", messages=HELLO)
        self.assertEqual(n.input_tokens, self.prompt_tokens(r.usage))
        # max_tokens bounds the output exactly.
        r3 = self.create(messages=HELLO, max_tokens=3)
        self.assertEqual((r3.stop_reason, r3.usage.output_tokens), ("max_tokens", 3))
        self.assertTrue(r.content[0].text.startswith(r3.content[0].text))

    def test_stream_event_order(self):
        full = self.create(messages=HELLO)
        # The wire: Anthropic's event names, a ping after the first block starts.
        req = urllib.request.Request(self.srv.url + "/v1/messages", data=json.dumps(
            {"model": "smol", "max_tokens": 24, "temperature": 0, "stream": True, "messages": HELLO}).encode(),
            headers={"Content-Type": "application/json", "x-api-key": KEY, "anthropic-version": "2023-06-01"})
        with urllib.request.urlopen(req, timeout=300) as resp:
            self.assertTrue(resp.headers["Content-Type"].startswith("text/event-stream"))
            wire = [ln[len("event: "):] for ln in resp.read().decode().splitlines() if ln.startswith("event: ")]
        self.assertEqual(wire[:4], ["message_start", "content_block_start", "ping", "content_block_delta"], wire)
        self.assertEqual(wire.count("ping"), 1)
        # Through the SDK (which drops pings).
        events = list(self.create(messages=HELLO, stream=True))
        types = [e.type for e in events]
        self.assertEqual(types, [t for t in wire if t != "ping"])
        self.assertEqual(types[:2], ["message_start", "content_block_start"], types)
        self.assertEqual(types[-3:], ["content_block_stop", "message_delta", "message_stop"], types)
        self.assertTrue(all(t == "content_block_delta" for t in types[2:-3]), types)
        self.assertEqual(events[1].content_block.type, "text")
        text = "".join(e.delta.text for e in events if e.type == "content_block_delta")
        self.assertEqual(text, full.content[0].text)
        self.assertEqual(events[-2].delta.stop_reason, full.stop_reason)
        self.assertEqual(events[-2].usage.output_tokens, full.usage.output_tokens)
        self.assertEqual(events[0].message.id[:4], "msg_")
        # The SDK's helper accumulates the same message.
        with self.client.messages.stream(model="smol", max_tokens=24, messages=HELLO,
                                         extra_body={"temperature": 0}) as s:
            streamed = "".join(s.text_stream)
            final = s.get_final_message()
        self.assertEqual(streamed, full.content[0].text)
        self.assertEqual(final.content[0].text, full.content[0].text)
        self.assertEqual(final.usage.output_tokens, full.usage.output_tokens)

    def test_stop_sequence(self):
        full = self.create(messages=HELLO, max_tokens=32).content[0].text
        words = full.split()
        self.assertGreater(len(words), 3, full)
        stop = words[2]
        r = self.create(messages=HELLO, max_tokens=32, stop_sequences=["\u2603never", stop])
        self.assertEqual((r.stop_reason, r.stop_sequence), ("stop_sequence", stop))
        self.assertEqual(r.content[0].text, full[:full.find(stop)])

    def check_forced(self, msg, name, schema):
        self.assertEqual(msg.stop_reason, "tool_use")
        uses = [b for b in msg.content if b.type == "tool_use"]
        self.assertEqual(len(uses), 1, msg.content)
        self.assertEqual(uses[0].name, name)
        self.assertTrue(uses[0].id.startswith("toolu_"))
        jsonschema.validate(uses[0].input, schema)
        return uses[0]

    def test_forced_tool_use(self):
        msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
        r = self.create(messages=msgs, tools=TOOLS, tool_choice={"type": "tool", "name": "get_weather"}, max_tokens=96)
        use = self.check_forced(r, "get_weather", WEATHER)
        # Streamed: input_json_delta fragments the SDK reassembles into the same input.
        with self.client.messages.stream(model="smol", max_tokens=96, messages=msgs, tools=TOOLS,
                                         extra_body={"temperature": 0},
                                         tool_choice={"type": "tool", "name": "get_weather"}) as s:
            kinds = [e.type for e in s]
            final = s.get_final_message()
        self.assertIn("input_json", kinds)
        self.assertEqual(self.check_forced(final, "get_weather", WEATHER).input, use.input)
        # "any": one call to one of the tools.
        r = self.create(messages=msgs, tools=TOOLS, tool_choice={"type": "any"}, max_tokens=96)
        self.assertEqual(r.stop_reason, "tool_use")
        # The call and its result go back through the template's tool forms.
        follow = msgs + [{"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": use.name,
                                                            "input": use.input}]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                       "content": "18 degrees, sunny"}]}]
        r2 = self.create(messages=follow, tools=TOOLS, tool_choice={"type": "none"})
        self.assertIn(r2.stop_reason, ("end_turn", "max_tokens"))
        self.assertEqual(self.client.messages.count_tokens(model="smol", messages=follow, tools=TOOLS).input_tokens,
                         self.prompt_tokens(r2.usage))

    def test_cache_control_usage(self):
        # A fresh prefix (the nonce comes first): nothing of it is cached yet.
        nonce = uuid.uuid4().hex
        long_doc = nonce + " " + " ".join(f"Fact {i}: the lighthouse number {i} stands on rock {i * 7}." for i in range(40))
        system = [{"type": "text", "text": "You answer questions about lighthouses."},
                  {"type": "text", "text": long_doc, "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
        h0, q0 = self.hits()
        r1 = self.create(system=system, messages=[{"role": "user", "content": "Which rock has lighthouse 3?"}],
                         max_tokens=4)
        p1 = self.prompt_tokens(r1.usage)
        h1, q1 = self.settled_hits(q0, p1)
        self.assertEqual(q1 - q0, p1)  # one query of the whole prompt
        self.assertEqual(r1.usage.cache_read_input_tokens, h1 - h0)
        self.assertEqual(r1.usage.cache_read_input_tokens, 0)
        prefix = r1.usage.cache_creation_input_tokens
        self.assertGreater(prefix, 200, r1.usage)  # the system prompt's tokens
        self.assertGreater(r1.usage.input_tokens, 0)  # the user turn after the breakpoint
        self.assertEqual(p1, self.client.messages.count_tokens(
            model="smol", system=system, messages=[{"role": "user", "content": "Which rock has lighthouse 3?"}]).input_tokens)
        # The same prefix, another question: read from the cache, as the engine counts it.
        r2 = self.create(system=system, messages=[{"role": "user", "content": "And lighthouse 9?"}], max_tokens=4)
        p2 = self.prompt_tokens(r2.usage)
        h2, _ = self.settled_hits(q1, p2)
        self.assertEqual(r2.usage.cache_read_input_tokens, h2 - h1)
        self.assertGreaterEqual(r2.usage.cache_read_input_tokens, prefix - 16)  # whole 16-token blocks
        self.assertEqual(r2.usage.cache_creation_input_tokens, max(0, prefix - r2.usage.cache_read_input_tokens))
        # Streamed: message_start carries the usage, as the engine counted it.
        q3 = [{"role": "user", "content": "And lighthouse 12?"}]
        events = list(self.create(system=system, messages=q3, max_tokens=4, stream=True))
        u3 = events[0].message.usage
        p3 = self.client.messages.count_tokens(model="smol", system=system, messages=q3).input_tokens
        self.assertEqual(self.prompt_tokens(u3), p3)
        h3, _ = self.settled_hits(q1 + p2, p3)
        self.assertEqual(u3.cache_read_input_tokens, h3 - h2)
        self.assertGreaterEqual(u3.cache_read_input_tokens, prefix - 16)
        self.assertEqual(events[-2].usage.cache_read_input_tokens, u3.cache_read_input_tokens)

    def test_errors_in_anthropic_shape(self):
        h0 = self.srv.metrics().get("pagoda:prompt_tokens_total", 0.0)
        with self.assertRaises(anthropic.BadRequestError) as cm:
            self.client.messages.create(model="smol", messages=HELLO, max_tokens=None)  # sent without max_tokens
        self.assertEqual(cm.exception.status_code, 400)
        self.assertEqual(cm.exception.body["type"], "error")
        self.assertEqual(cm.exception.body["error"]["type"], "invalid_request_error")
        self.assertIn("max_tokens", cm.exception.body["error"]["message"])
        bad_ttl = [{"type": "text", "text": "x", "cache_control": {"type": "ephemeral", "ttl": "10m"}}]
        with self.assertRaises(anthropic.BadRequestError) as cm:
            self.create(system=bad_ttl, messages=HELLO)
        self.assertIn("system[0].cache_control.ttl", cm.exception.body["error"]["message"])
        with self.assertRaises(anthropic.NotFoundError) as cm:
            self.create(model="no-such-model", messages=HELLO)
        self.assertEqual(cm.exception.body["error"]["type"], "not_found_error")
        bad_key = anthropic.Anthropic(base_url=self.srv.url, api_key="wrong", max_retries=0)
        with self.assertRaises(anthropic.AuthenticationError) as cm:
            bad_key.messages.create(model="smol", max_tokens=4, messages=HELLO)
        self.assertEqual(cm.exception.body["error"]["type"], "authentication_error")
        # Bearer works as well as x-api-key; anthropic-version is accepted.
        st, body = post(self.srv.url + "/v1/messages", {"model": "smol", "max_tokens": 2, "messages": HELLO},
                        {"Authorization": "Bearer " + KEY, "anthropic-version": "2023-06-01"})
        self.assertEqual((st, body["type"]), (200, "message"))
        # Refused requests ran nothing (the one accepted request above ran its prompt).
        want = sum(body["usage"][k] for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"))
        deadline = time.time() + 10
        while self.srv.metrics().get("pagoda:prompt_tokens_total", 0.0) - h0 < want and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
        self.assertEqual(self.srv.metrics().get("pagoda:prompt_tokens_total", 0.0) - h0, want)

    def test_openai_cache_fields(self):
        auth = {"Authorization": "Bearer " + KEY}
        for path, base in (("/v1/chat/completions", {"messages": HELLO}), ("/v1/completions", {"prompt": "The sea"})):
            st, body = post(self.srv.url + path, {**base, "max_tokens": 2, "priority": -5, "prompt_cache_key": "conv-1",
                                                  "prompt_cache_retention": "24h"}, auth)
            self.assertEqual(st, 200, body)
            for field, value in (("priority", "high"), ("priority", 2 ** 31), ("prompt_cache_retention", "forever"),
                                 ("prompt_cache_key", 7)):
                st, body = post(self.srv.url + path, {**base, "max_tokens": 2, field: value}, auth)
                self.assertEqual(st, 400, body)
                self.assertEqual(body["error"]["param"], field)
        # metadata.user_id is accepted on /v1/messages.
        r = self.create(messages=HELLO, max_tokens=2, metadata={"user_id": "user-42"})
        self.assertEqual(r.usage.output_tokens, 2)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
