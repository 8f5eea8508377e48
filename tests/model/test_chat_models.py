#!/usr/bin/env python3
"""Chat through /v1/chat/completions for the newer model families (issue 14).

Usage: test_chat_models.py PAGODA_BINARY REPO_ROOT

Synth files (`pagoda synth --preset tiny-<arch>`) carry their family's template in
tokenizer.chat_template (src/gguf/synth_vocab.cc): qwen3 ChatML, Llama 3's header
format, Phi-3.5's <|user|> turns. For each, the rendered prompt is checked byte for
byte (`pagoda template`), the ids the server feeds the model must be that text
tokenized with the family's markers as single control tokens, and
a chat request answers with exactly those prompt ids and the same greedy tokens
as a completion of them.

The real Gemma 3 270M file (scripts/setup; PAGODA_GEMMA3 overrides the path) has
no tokenizer.chat_template: chat is a 400 that says to pass --chat-template, and
with --chat-template google-gemma-2-2b-it.jinja (the Gemma turn format, from the
llama-cpp-python sdist that setup extracts into .cache/templates) it answers in
Gemma's format. Skipped when the file or the template is absent, except under CI
(CI=true), where setup has fetched both and their absence is a failure.
"""
import glob
import json
import os
import subprocess
import sys
import tempfile
import unittest

BINARY, REPO = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(REPO, "tests", "server"))
from serverutil import PagodaServer, post_json as post  # noqa: E402

GEMMA = os.environ.get("PAGODA_GEMMA3", os.path.join(REPO, "models", "gemma-3-270m-q4_k_m.gguf"))
GEMMA_TEMPLATES = glob.glob(
    os.path.join(REPO, ".cache", "templates", "*", "vendor", "llama.cpp", "models", "templates",
                 "google-gemma-2-2b-it.jinja"))
IN_CI = os.environ.get("CI") == "true"

MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "hello there"},
    {"role": "assistant", "content": "hi"},
    {"role": "user", "content": "name a color"},
]

# Each family's rendering of MESSAGES with the generation prompt, and the markers that
# must reach the model as single control tokens.
FAMILIES = {
    "tiny-qwen3": (
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nhello there<|im_end|>\n"
        "<|im_start|>assistant\nhi<|im_end|>\n<|im_start|>user\nname a color<|im_end|>\n<|im_start|>assistant\n",
        ["<|im_start|>", "<|im_end|>"]),
    "tiny-llama3": (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nhello there<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nhi<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nname a color<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n",
        ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]),
    "tiny-phi3": (
        "<|system|>\nYou are terse.<|end|>\n<|user|>\nhello there<|end|>\n<|assistant|>\nhi<|end|>\n"
        "<|user|>\nname a color<|end|>\n<|assistant|>\n",
        ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]),
}


class ChatChecks:
    """Checks shared by the synth families and Gemma: srv is a running PagodaServer."""

    def tokenize(self, srv, **body):
        st, tok = post(srv.url + "/tokenize", body)
        self.assertEqual(st, 200, tok)
        return tok["tokens"]

    def check_prompt(self, srv, messages, expected, markers):
        """The ids chat feeds the model are `expected` tokenized with its markers as
        control tokens (the server runs with --parse-special-in-prompts, so /tokenize of
        a text reads them as the template's are), and each marker is one token there."""
        ids = self.tokenize(srv, messages=messages)
        self.assertEqual(ids, self.tokenize(srv, prompt=expected, add_special_tokens=False))
        for m in markers:
            one = self.tokenize(srv, prompt=m, add_special_tokens=False)
            self.assertEqual(len(one), 1, "%s is not one token" % m)
            self.assertIn(one[0], ids)
        return ids

    def check_chat(self, srv, messages, ids, n=6):
        body = {"model": "m", "messages": messages, "max_tokens": n, "temperature": 0, "ignore_eos": True,
                "return_token_ids": True}
        st, chat = post(srv.url + "/v1/chat/completions", body)
        self.assertEqual(st, 200, chat)
        self.assertEqual(chat["prompt_token_ids"], ids)
        self.assertEqual(chat["usage"]["prompt_tokens"], len(ids))
        self.assertEqual(chat["usage"]["completion_tokens"], n)
        self.assertEqual(chat["choices"][0]["message"]["role"], "assistant")
        # Chat is the rendered template then plain greedy generation: a completion of the
        # same ids picks the same tokens.
        st, comp = post(srv.url + "/v1/completions", {"model": "m", "prompt": ids, "max_tokens": n, "temperature": 0,
                                                      "ignore_eos": True, "return_token_ids": True})
        self.assertEqual(st, 200, comp)
        self.assertEqual(comp["choices"][0]["token_ids"], chat["choices"][0]["token_ids"])
        return chat


class SynthFamilies(unittest.TestCase, ChatChecks):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.msgs = os.path.join(cls.tmp.name, "messages.json")
        with open(cls.msgs, "w") as f:
            json.dump(MESSAGES, f)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def family(self, preset):
        expected, markers = FAMILIES[preset]
        path = os.path.join(self.tmp.name, preset + ".gguf")
        subprocess.run([BINARY, "synth", "--preset", preset, "--type", "f32", "-o", path], check=True,
                       capture_output=True)
        rendered = subprocess.run([BINARY, "template", "--model", path, "--messages", self.msgs], check=True,
                                  capture_output=True, text=True).stdout
        self.assertEqual(rendered, expected)
        with PagodaServer(BINARY, path, ["--served-model-name", "m", "--num-kv-blocks", "64", "-c", "256",
                                          "--parse-special-in-prompts"]) as srv:
            ids = self.check_prompt(srv, MESSAGES, expected, markers)
            self.check_chat(srv, MESSAGES, ids)
            self.assertTrue(any("chat template: renders" in l for l in srv.log), "".join(srv.log))

    def test_qwen3(self):
        self.family("tiny-qwen3")

    def test_llama3(self):
        self.family("tiny-llama3")

    def test_phi3(self):
        self.family("tiny-phi3")


def gemma_missing():
    missing = [p for p, ok in [(GEMMA, os.path.exists(GEMMA)), ("google-gemma-2-2b-it.jinja", GEMMA_TEMPLATES)]
               if not ok]
    return ", ".join(missing)


@unittest.skipIf(gemma_missing() and not IN_CI, "absent (scripts/setup fetches them): " + gemma_missing())
class Gemma3(unittest.TestCase, ChatChecks):
    # Gemma's template refuses a system turn (raise_exception): user / model / user.
    MESSAGES = [{"role": "user", "content": "Hello!"}, {"role": "assistant", "content": "Hi. How can I help?"},
                {"role": "user", "content": "What is the capital of France?"}]
    EXPECTED = ("<bos><start_of_turn>user\nHello!<end_of_turn>\n<start_of_turn>model\nHi. How can I help?<end_of_turn>\n"
                "<start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n")
    ARGS = ["--served-model-name", "m", "--num-kv-blocks", "64", "-c", "1024", "--parse-special-in-prompts"]

    def setUp(self):
        self.assertEqual(gemma_missing(), "", "CI=true: scripts/setup should have fetched these")

    def test_without_template_400_says_pass_chat_template(self):
        with PagodaServer(BINARY, GEMMA, self.ARGS) as srv:
            st, err = post(srv.url + "/v1/chat/completions", {"model": "m", "messages": self.MESSAGES, "max_tokens": 2})
            self.assertEqual(st, 400, err)
            self.assertIn("--chat-template", err["error"]["message"])
            # Completions need no template and still work.
            st, comp = post(srv.url + "/v1/completions", {"model": "m", "prompt": "Paris is", "max_tokens": 2})
            self.assertEqual(st, 200, comp)
            self.assertTrue(any("chat template: none usable" in l for l in srv.log), "".join(srv.log))

    def test_with_gemma_template(self):
        with PagodaServer(BINARY, GEMMA, self.ARGS + ["--chat-template", GEMMA_TEMPLATES[0]]) as srv:
            ids = self.check_prompt(srv, self.MESSAGES, self.EXPECTED, ["<bos>", "<start_of_turn>", "<end_of_turn>"])
            # gemma-3-270m is the pretrained model, not the instruction-tuned one: what it
            # answers is not checked, only that chat generates from exactly these ids.
            self.check_chat(srv, self.MESSAGES, ids, n=8)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v"])
