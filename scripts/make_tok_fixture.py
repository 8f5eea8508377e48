#!/usr/bin/env python3
"""Builds tests/tok/fixtures/smollm2_tokens.json: token ids of varied strings from an
independent tokenizer (HF `tokenizers`, PyPI) built from the vocabulary and merges
stored in the SmolLM2 GGUF, so the C++ byte-level BPE is checked against it.

The pre-tokenizer is SmolLM2's HF tokenizer.json one: Sequence[Digits(individual_digits
=true), ByteLevel(add_prefix_space=false, use_regex=true)] (llama.cpp's pre "smollm":
regexes "\\p{N}" then GPT-2's). Control tokens (token_type 3) are added as special
tokens, so they are recognised in the text (the C++ side: parse_special = true).

It also writes tests/tok/fixtures/chat_templates.json: chat templates of each family
rendered by Jinja2 the way HF transformers' apply_chat_template does (sandboxed,
trim_blocks, lstrip_blocks, raise_exception), for the C++ renderer to reproduce.

usage: scripts/make_tok_fixture.py [models/SmolLM2-135M-Instruct.Q4_1.gguf] [out.json]
"""
import json
import os
import struct
import sys

import jinja2
import jinja2.sandbox
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

STRINGS = [
    "Hello world",
    "Hello, world! How are you today?",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure you've heard they'll say we'd won't can't",
    "DON'T SHOUT, IT'S RUDE AND YOU'LL REGRET IT",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "for (int i = 0; i < 10; ++i) { sum += a[i]; }",
    "3.14159265358979",
    "1234567890 and 2024-11-29 at 10:15",
    "Price: $1,299.99 (20% off!)",
    "Emoji: \U0001F600\U0001F389\U0001F44D\U0001F3FD and \u2764\ufe0f",
    "\U0001F468\u200D\U0001F469\u200D\U0001F467\u200D\U0001F466 family",
    "\u4e2d\u6587\u5206\u8bcd\u6d4b\u8bd5\uff1a\u4f60\u597d\uff0c\u4e16\u754c\uff01",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3068\u30ab\u30bf\u30ab\u30ca",
    "\ud55c\uad6d\uc5b4 \ubb38\uc7a5\uc785\ub2c8\ub2e4",
    "Caf\u00e9 na\u00efve r\u00e9sum\u00e9 fa\u00e7ade \u00c5ngstr\u00f6m",
    "\u00dcn\u00efc\u00f6d\u00e9 \u00e0cc\u00e9nts: \u00e9\u00e8\u00ea\u00eb \u00f1 \u00e7 \u00f8",
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u041a\u0430\u043a \u0434\u0435\u043b\u0430?",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
    "\n\n  \t",
    "   leading and trailing spaces   ",
    "multiple     spaces    between   words",
    "tabs\tand\ttabs\t\tdouble",
    "line1\nline2\r\nline3\n\n\nline6",
    "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>text after special",
    "not special: <|im_start without close and <im_end>",
    "<|im_start|><|im_end|><|im_start|>",
    "https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct?x=1&y=2#frag",
    "email@example.com, user_name-42",
    "{\"key\": [1, 2, 3], \"nested\": {\"a\": null}}",
    "SELECT * FROM users WHERE id = 42;",
    "x\u00b2+y\u00b2=z\u00b2 \u2211\u222b\u221a\u221e \u2264\u2265\u2260",
    "Mixed123Numbers456andLetters",
    "Ellipsis\u2026 \u201cquotes\u201d \u2018single\u2019 \u2014 dash",
    "zero\u200bwidth",
    "a",
    " ",
    "",
    "Once upon a time, there was a little girl named Lily. She loved to play outside "
    "in the park. One day, she saw a big, red ball.",
]


# Chat templates as published in the models' tokenizer_config.json.
LLAMA2_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}")
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}"
    "{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}")
GEMMA3_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""

SYS = {"role": "system", "content": "You are a helpful assistant."}
U1 = {"role": "user", "content": "Hello! "}
A1 = {"role": "assistant", "content": "  Hi there, how can I help?\n"}
U2 = {"role": "user", "content": "What is 2+2?"}
CONVERSATIONS = {
    "with_system": [SYS, U1, A1, U2],
    "no_system": [U1, A1, U2],
    "single_user": [U2],
    "not_alternating": [U1, U2],
    "tool": [U2, {"role": "assistant", "content": "calc(2+2)"}, {"role": "tool", "content": "4"}],
}


def render_jinja(source, messages, add_generation_prompt, bos, eos):
    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(source).render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            bos_token=bos, eos_token=eos), None
    except jinja2.exceptions.TemplateError as e:
        return None, str(e)


def chat_cases(smollm_template):
    templates = [
        ("chatml", "smollm2", smollm_template, "<|im_start|>", "<|im_end|>"),
        ("llama2", "llama2", LLAMA2_TEMPLATE, "<s>", "</s>"),
        ("llama3", "llama3", LLAMA3_TEMPLATE, "<|begin_of_text|>", "<|end_of_text|>"),
        ("gemma", "gemma", GEMMA_TEMPLATE, "<bos>", "<eos>"),
        ("gemma", "gemma3", GEMMA3_TEMPLATE, "<bos>", "<eos>"),
    ]
    cases = []
    for kind, name, source, bos, eos in templates:
        for conv_name, messages in CONVERSATIONS.items():
            for gen in (True, False):
                text, err = render_jinja(source, messages, gen, bos, eos)
                cases.append({"kind": kind, "name": name, "template": source, "bos": bos,
                              "eos": eos, "conversation": conv_name, "messages": messages,
                              "add_generation_prompt": gen, "expected": text, "error": err})
    return cases


def read_gguf_metadata(path):
    with open(path, "rb") as f:
        data = f.read()
    off = 0

    def rd(fmt):
        nonlocal off
        v = struct.unpack_from("<" + fmt, data, off)[0]
        off += struct.calcsize("<" + fmt)
        return v

    def rstr():
        nonlocal off
        n = rd("Q")
        s = data[off:off + n]
        off += n
        return s.decode("utf-8")

    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def rval(t):
        if t in scalar:
            return rd(scalar[t])
        if t == 8:
            return rstr()
        if t == 9:
            et = rd("I")
            n = rd("Q")
            return [rval(et) for _ in range(n)]
        raise ValueError(f"bad GGUF value type {t}")

    if data[:4] != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    off = 4
    rd("I")  # version
    rd("Q")  # tensor count
    n_kv = rd("Q")
    kv = {}
    for _ in range(n_kv):
        key = rstr()
        kv[key] = rval(rd("I"))
    return kv


def build_tokenizer(kv):
    tokens = kv["tokenizer.ggml.tokens"]
    types = kv["tokenizer.ggml.token_type"]
    merges = []
    for m in kv["tokenizer.ggml.merges"]:
        pos = m.find(" ", 1)  # as llama.cpp splits a merge line
        merges.append((m[:pos], m[pos + 1:]))
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    specials = [AddedToken(t, special=True, normalized=False)
                for t, ty in zip(tokens, types) if ty == 3]
    tok.add_special_tokens(specials)
    return tok


def main():
    model = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(
        ROOT, "tests", "tok", "fixtures", "smollm2_tokens.json")
    kv = read_gguf_metadata(model)
    assert kv["tokenizer.ggml.model"] == "gpt2" and kv["tokenizer.ggml.pre"] == "smollm"
    tok = build_tokenizer(kv)
    cases = []
    for s in STRINGS:
        ids = tok.encode(s, add_special_tokens=False).ids
        assert tok.decode(ids, skip_special_tokens=False) == s, repr(s)
        cases.append({"text": s, "ids": ids})
    doc = {
        "model": os.path.basename(model),
        "tokenizer": "HF tokenizers BPE from the GGUF vocab/merges; pre-tokenizer "
                     "Sequence[Digits(individual_digits=True), ByteLevel(add_prefix_space=False, "
                     "use_regex=True)]; control tokens added as special",
        "n_vocab": len(kv["tokenizer.ggml.tokens"]),
        "n_merges": len(kv["tokenizer.ggml.merges"]),
        "cases": cases,
    }
    os.makedirs(os.path.dirname(out), exist_ok=True)
    # One case per line keeps the file readable and its diffs small.
    head = {k: v for k, v in doc.items() if k != "cases"}
    with open(out, "w", encoding="utf-8") as f:
        f.write(json.dumps(head, ensure_ascii=False, indent=1)[:-2] + ',\n "cases": [\n')
        f.write(",\n".join("  " + json.dumps(c, ensure_ascii=False) for c in cases))
        f.write("\n ]\n}\n")
    print(f"wrote {len(cases)} cases to {out}")

    chat = chat_cases(kv["tokenizer.chat_template"])
    chat_out = os.path.join(os.path.dirname(out), "chat_templates.json")
    with open(chat_out, "w", encoding="utf-8") as f:
        f.write("[\n" + ",\n".join(" " + json.dumps(c, ensure_ascii=False) for c in chat) + "\n]\n")
    print(f"wrote {len(chat)} chat template cases to {chat_out}")


if __name__ == "__main__":
    main()
