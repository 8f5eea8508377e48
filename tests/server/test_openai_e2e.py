#!/usr/bin/env python3
"""End-to-end tests of `pagoda serve` driven by the official `openai` package.

Usage: test_openai_e2e.py PAGODA_BINARY TEST_DATA_DIR DEFAULT_MODEL
Runs against stories260K (completions, exact reference text) and, when present,
SmolLM2-135M-Instruct (chat, cached tokens on a repeated system prompt).
"""
import json
import os
import sys
import threading
import unittest
import urllib.request

import openai

sys.path.insert(0, os.path.dirname(__file__))
from serverutil import PagodaServer, ServerTestCase  # noqa: E402

BINARY, DATA, SMOL = sys.argv[1], sys.argv[2], sys.argv[3]
STORIES = os.path.join(DATA, "stories260K.gguf")
REFERENCE = [json.loads(l) for l in open(os.path.join(DATA, "stories260K.reference.jsonl"))]


def post_json(url, body, timeout=120):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=timeout).read())


def sse_events(url, body, timeout=120):
    """POSTs a streaming request; returns the JSON events before data: [DONE]."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    text = urllib.request.urlopen(req, timeout=timeout).read().decode()
    data = [line[5:].strip() for line in text.split("\n") if line.startswith("data:")]
    assert data and data[-1] == "[DONE]", text[-200:]
    return [json.loads(d) for d in data[:-1]]


class StoriesCompletions(ServerTestCase):
    SERVER = (BINARY, STORIES, ["--served-model-name", "stories", "--num-kv-blocks", "256"])

    def test_models(self):
        models = self.client.models.list()
        self.assertEqual([m.id for m in models.data], ["stories"])

    def test_greedy_matches_reference(self):
        for ref in REFERENCE:
            r = self.client.completions.create(model="stories", prompt=ref["prompt"], max_tokens=ref["n_predict"],
                                               temperature=0)
            self.assertEqual(r.choices[0].text, ref["text"])
            self.assertEqual(r.choices[0].finish_reason, "length")
            self.assertEqual(r.usage.prompt_tokens, len(ref["prompt_tokens"]))
            self.assertEqual(r.usage.completion_tokens, ref["n_predict"])

    def test_token_prompt_and_echo(self):
        ref = REFERENCE[0]
        r = self.client.completions.create(model="stories", prompt=ref["prompt_tokens"], max_tokens=8, temperature=0,
                                           echo=True)
        self.assertTrue(r.choices[0].text.startswith(ref["prompt"]))
        self.assertTrue(ref["text"].startswith(r.choices[0].text[len(ref["prompt"]):]))

    def test_stream_equals_non_stream(self):
        ref = REFERENCE[1]
        stream = self.client.completions.create(model="stories", prompt=ref["prompt"], max_tokens=40, temperature=0,
                                                stream=True, stream_options={"include_usage": True})
        text, usage, finish = "", None, None
        for chunk in stream:
            if chunk.usage:
                usage = chunk.usage
                self.assertEqual(chunk.choices, [])
            for c in chunk.choices:
                text += c.text
                finish = c.finish_reason or finish
        full = self.client.completions.create(model="stories", prompt=ref["prompt"], max_tokens=40, temperature=0)
        self.assertEqual(text, full.choices[0].text)
        self.assertEqual(finish, "length")
        self.assertIsNotNone(usage)
        self.assertEqual(usage.completion_tokens, 40)

    def test_stop_string(self):
        ref = REFERENCE[0]
        r = self.client.completions.create(model="stories", prompt=ref["prompt"], max_tokens=100, temperature=0,
                                           stop=["girl"])
        self.assertEqual(r.choices[0].finish_reason, "stop")
        self.assertEqual(r.choices[0].text, ref["text"][:ref["text"].index("girl")])

    def test_seed_reproducible_and_n2(self):
        kw = dict(model="stories", prompt="Lily and Tom", max_tokens=24, temperature=1.0, seed=1234, n=2)
        a = self.client.completions.create(**kw)
        b = self.client.completions.create(**kw)
        self.assertEqual(len(a.choices), 2)
        self.assertEqual([c.text for c in a.choices], [c.text for c in b.choices])
        self.assertEqual(a.usage.completion_tokens, 48)
        c = self.client.completions.create(**dict(kw, seed=99))
        self.assertNotEqual([x.text for x in a.choices], [x.text for x in c.choices])

    def test_logprobs(self):
        r = self.client.completions.create(model="stories", prompt="Once upon a time", max_tokens=5, temperature=0,
                                           logprobs=3)
        lp = r.choices[0].logprobs
        self.assertEqual(len(lp.tokens), 5)
        self.assertEqual(len(lp.token_logprobs), 5)
        self.assertEqual("".join(lp.tokens), r.choices[0].text)
        for top, chosen in zip(lp.top_logprobs, lp.token_logprobs):
            self.assertEqual(len(top), 3)
            self.assertAlmostEqual(max(top.values()), chosen, places=4)  # greedy picks the best
            self.assertLessEqual(chosen, 0.0)

    def test_cached_tokens_on_repeat(self):
        prompt = REFERENCE[2]["prompt"] + " " + REFERENCE[0]["text"][:300]
        self.client.completions.create(model="stories", prompt=prompt, max_tokens=2, temperature=0)
        r = self.client.completions.create(model="stories", prompt=prompt, max_tokens=2, temperature=0)
        self.assertGreater(r.usage.prompt_tokens_details.cached_tokens, 0)

    def test_return_token_ids(self):
        # vLLM's extension: the ids of each streamed chunk, the full list non-stream, and the prompt ids.
        ref = REFERENCE[0]
        body = {"model": "stories", "prompt": ref["prompt"], "max_tokens": 20, "temperature": 0,
                "return_token_ids": True}
        full = post_json(self.srv.url + "/v1/completions", body)
        self.assertEqual(full["choices"][0]["token_ids"], ref["generated_tokens"][:20])
        self.assertEqual(full["choices"][0]["prompt_token_ids"], ref["prompt_tokens"])
        events = sse_events(self.srv.url + "/v1/completions", dict(body, stream=True))
        chunks = [c for e in events for c in e.get("choices", [])]
        self.assertEqual(len(chunks), 20)
        self.assertTrue(all(len(c["token_ids"]) == 1 for c in chunks))
        self.assertEqual([t for c in chunks for t in c["token_ids"]], ref["generated_tokens"][:20])
        self.assertEqual(chunks[0]["prompt_token_ids"], ref["prompt_tokens"])
        self.assertNotIn("prompt_token_ids", chunks[1])
        self.assertEqual("".join(c["text"] for c in chunks), full["choices"][0]["text"])
        # Off by default.
        plain = post_json(self.srv.url + "/v1/completions", dict(body, return_token_ids=False))
        self.assertNotIn("token_ids", plain["choices"][0])

    def test_context_limit_error(self):
        with self.assertRaises(openai.BadRequestError) as cm:
            self.client.completions.create(model="stories", prompt="Once upon a time", max_tokens=100000)
        self.assertIn("512", str(cm.exception))

    def test_unknown_model(self):
        with self.assertRaises(openai.NotFoundError):
            self.client.completions.create(model="nope", prompt="hi", max_tokens=2)


class StoriesChatTemplate(unittest.TestCase):
    """stories260K has no tokenizer.chat_template: chat is a 400 that names --chat-template,
    and works once one is given."""
    TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                "{% if add_generation_prompt %}assistant:{% endif %}")

    def test_without_template_400_names_the_flag(self):
        with PagodaServer(BINARY, STORIES, ["--num-kv-blocks", "64"]) as srv:
            client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120)
            with self.assertRaises(openai.BadRequestError) as cm:
                client.chat.completions.create(model="stories260K", messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=2)
            self.assertIn("--chat-template", str(cm.exception))

    def test_chat_template_file(self):
        import tempfile
        with tempfile.NamedTemporaryFile("w", suffix=".jinja", delete=False) as f:
            f.write(self.TEMPLATE)
        try:
            with PagodaServer(BINARY, STORIES, ["--num-kv-blocks", "64", "--chat-template", f.name]) as srv:
                msgs = [{"role": "user", "content": "Lily went to the park."}]
                ids = post_json(srv.url + "/tokenize", {"messages": msgs})["tokens"]
                text = post_json(srv.url + "/detokenize", {"tokens": ids})["prompt"]
                self.assertEqual(text, "user: Lily went to the park.\nassistant:")
                client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120)
                r = client.chat.completions.create(model="stories260K", messages=msgs, max_tokens=4, temperature=0)
                self.assertEqual(r.usage.prompt_tokens, len(ids))
                self.assertEqual(r.usage.completion_tokens, 4)
        finally:
            os.unlink(f.name)


@unittest.skipUnless(os.path.exists(SMOL), "default model not fetched (scripts/setup)")
class SmolChat(ServerTestCase):
    SERVER = (BINARY, SMOL, ["--served-model-name", "smol", "--kv-cache-memory", "64MiB", "-c", "2048"])
    CLIENT_TIMEOUT = 300

    def test_chat_matches_completion_of_rendered_template(self):
        msgs = [{"role": "user", "content": "What is the capital of France?"}]
        r = self.client.chat.completions.create(model="smol", messages=msgs, max_tokens=24, temperature=0)
        self.assertEqual(r.choices[0].message.role, "assistant")
        self.assertTrue(r.choices[0].message.content)
        # The chat path is the template rendered by /tokenize, then plain greedy generation.
        import urllib.request
        req = urllib.request.Request(self.srv.url + "/tokenize", data=json.dumps({"messages": msgs}).encode(),
                                     headers={"Content-Type": "application/json"})
        ids = json.loads(urllib.request.urlopen(req, timeout=60).read())["tokens"]
        self.assertEqual(ids[:1], [1])  # <|im_start|>
        self.assertEqual(r.usage.prompt_tokens, len(ids))
        c = self.client.completions.create(model="smol", prompt=ids, max_tokens=24, temperature=0)
        self.assertEqual(c.choices[0].text, r.choices[0].message.content)

    def test_chat_stream_usage_and_logprobs(self):
        msgs = [{"role": "user", "content": "Name a color."}]
        stream = self.client.chat.completions.create(model="smol", messages=msgs, max_tokens=8, temperature=0,
                                                     stream=True, stream_options={"include_usage": True},
                                                     logprobs=True, top_logprobs=2)
        text, usage, n_lp = "", None, 0
        for chunk in stream:
            if chunk.usage:
                usage = chunk.usage
            for c in chunk.choices:
                text += c.delta.content or ""
                if c.logprobs and c.logprobs.content:
                    n_lp += len(c.logprobs.content)
                    for t in c.logprobs.content:
                        self.assertEqual(len(t.top_logprobs), 2)
        full = self.client.chat.completions.create(model="smol", messages=msgs, max_tokens=8, temperature=0)
        self.assertEqual(text, full.choices[0].message.content)
        self.assertEqual(usage.completion_tokens, n_lp)

    def test_chat_return_token_ids(self):
        msgs = [{"role": "user", "content": "Name a color."}]
        body = {"model": "smol", "messages": msgs, "max_tokens": 6, "temperature": 0, "ignore_eos": True,
                "return_token_ids": True}
        ids = post_json(self.srv.url + "/tokenize", {"messages": msgs})["tokens"]
        full = post_json(self.srv.url + "/v1/chat/completions", body, timeout=300)
        self.assertEqual(full["prompt_token_ids"], ids)
        self.assertEqual(len(full["choices"][0]["token_ids"]), 6)
        events = sse_events(self.srv.url + "/v1/chat/completions", dict(body, stream=True), timeout=300)
        self.assertEqual(events[0]["prompt_token_ids"], ids)
        streamed = [t for e in events for c in e["choices"] for t in c["token_ids"]]
        self.assertEqual(streamed, full["choices"][0]["token_ids"])

    def test_cached_tokens_system_prompt(self):
        system = "You are a careful assistant. " * 12
        for q in ["What is 2+2?", "Name a fruit."]:
            r = self.client.chat.completions.create(
                model="smol", messages=[{"role": "system", "content": system}, {"role": "user", "content": q}],
                max_tokens=4, temperature=0)
        self.assertGreater(r.usage.prompt_tokens_details.cached_tokens, 64)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v"])
