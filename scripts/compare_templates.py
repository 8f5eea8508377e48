#!/usr/bin/env python3
"""Compare pagoda's Jinja interpreter with Python jinja2 on real chat templates.

For every *.jinja template in the template folder and each of eight conversations (two with reasoning blocks),
render with jinja2 configured as Hugging Face's apply_chat_template does (the
oracle) and with `pagoda template` (the subject), then classify the template:

  identical    every conversation renders byte-identically (or both sides raise)
  unsupported  pagoda refuses a conversation with an error, never a different text
  MISMATCH     pagoda printed a different prompt, or rendered where jinja2 raised

Exit status 0 when there is no mismatch and at least --min-identical (default 90%)
of the templates are identical; 77 (ctest's skip code) when the templates or
jinja2 are missing and $CI is not set.

Templates: the llama.cpp tree inside the llama-cpp-python sdist carries about 70
(vendor/llama.cpp/models/templates/*.jinja); scripts/setup extracts them into
.cache/templates. --write-fixture FILE writes the renders of the given templates
for the committed C++ test (tests/tok/fixtures/jinja_renders.json).
"""
import argparse
import datetime
import glob
import json
import os
import subprocess
import sys
import tempfile

SKIP = 77
NOW = 1721952000  # 2024-07-26 00:00:00 UTC, what strftime_now formats on both sides
BOS, EOS = "<s>", "</s>"

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name, e.g. \"Paris\""},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "add", "description": "Add two integers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                       "required": ["a", "b"]}}},
]

CONVERSATIONS = [
    {"name": "system_user", "gen": True, "tools": None, "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France? Answer in \"one\" word."}]},
    {"name": "multi_turn", "gen": True, "tools": None, "messages": [
        {"role": "user", "content": "Hello!  "},
        {"role": "assistant", "content": "Hi there, how can I help?\n"},
        {"role": "user", "content": "Écris un haïku sur la mer. 🌊"}]},
    {"name": "assistant_last", "gen": False, "tools": None, "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"}]},
    {"name": "tool_definitions", "gen": True, "tools": TOOLS, "messages": [
        {"role": "system", "content": "You can call functions."},
        {"role": "user", "content": "What's the weather in Paris?"}]},
    {"name": "tool_calls", "gen": True, "tools": TOOLS, "messages": [
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]},
        {"role": "tool", "tool_call_id": "call_1", "name": "get_weather",
         "content": "{\"temperature\": 21, \"sky\": \"clear\"}"}]},
    # Reasoning blocks (Qwen3/3.5, DeepSeek-R1, LFM2.5...): an earlier turn's thinking
    # as reasoning_content and as <think> in the content; templates keep or drop it.
    {"name": "reasoning", "gen": True, "tools": None, "messages": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "reasoning_content": "Two plus two.\nThat is four.", "content": "4"},
        {"role": "user", "content": "And 3+3?"},
        {"role": "assistant", "content": "<think>\nThree plus three is six.\n</think>\n\n6"},
        {"role": "user", "content": "Thanks."}]},
    {"name": "reasoning_last", "gen": False, "tools": None, "messages": [
        {"role": "system", "content": "Think first."},
        {"role": "user", "content": "Is 7 prime?"},
        {"role": "assistant", "reasoning_content": "7 has no divisor but 1 and 7.", "content": "Yes."}]},
    {"name": "content_parts", "gen": True, "tools": None, "messages": [
        {"role": "system", "content": "You describe things."},
        {"role": "user", "content": [{"type": "text", "text": "Describe this:"},
                                     {"type": "text", "text": " a red apple."}]}]},
]


def find_templates(folder):
    if folder:
        return sorted(glob.glob(os.path.join(folder, "*.jinja")))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for pattern in (".cache/templates/*/vendor/llama.cpp/models/templates/*.jinja",
                    "build/templates/*.jinja"):
        found = sorted(glob.glob(os.path.join(root, pattern)))
        if found:
            return found
    return []


def oracle_env():
    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):  # HF's AssistantTracker, minus the index tracking
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

        def _render(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.fromtimestamp(NOW, datetime.timezone.utc).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render_oracle(env, source, conv):
    try:
        t = env.from_string(source)
        return True, t.render(messages=conv["messages"], tools=conv["tools"], documents=None,
                              add_generation_prompt=conv["gen"], bos_token=BOS, eos_token=EOS)
    except Exception as e:  # noqa: BLE001 - any failure of the oracle is "raises"
        return False, f"{type(e).__name__}: {e}"


def render_subject(pagoda, tmpdir, path, conv):
    mpath = os.path.join(tmpdir, "messages.json")
    with open(mpath, "w", encoding="utf-8") as f:
        json.dump(conv["messages"], f, ensure_ascii=False)
    cmd = [pagoda, "template", "--template", path, "--messages", mpath, "--bos", BOS, "--eos", EOS,
           "--now", str(NOW)]
    if conv["tools"] is not None:
        tpath = os.path.join(tmpdir, "tools.json")
        with open(tpath, "w", encoding="utf-8") as f:
            json.dump(conv["tools"], f, ensure_ascii=False)
        cmd += ["--tools", tpath]
    if not conv["gen"]:
        cmd.append("--no-generation-prompt")
    try:
        p = subprocess.run(cmd, capture_output=True, timeout=20)
    except subprocess.TimeoutExpired:
        return False, "timeout"
    if p.returncode != 0:
        return False, p.stderr.decode("utf-8", "replace").strip()
    return True, p.stdout.decode("utf-8", "surrogateescape")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pagoda", default=os.environ.get("PAGODA_BIN", "build/release/src/cli/pagoda"))
    ap.add_argument("--templates", help="folder of *.jinja templates (default: the extracted sdist)")
    ap.add_argument("--min-identical", type=float, default=0.9)
    ap.add_argument("--write-fixture", help="write jinja2's renders of --only templates to this JSON file")
    ap.add_argument("--only", nargs="*", help="template base names (without .jinja)")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()

    in_ci = bool(os.environ.get("CI"))
    try:
        env = oracle_env()
    except ImportError:
        print("compare_templates: jinja2 is not installed (pip install jinja2)")
        return 1 if in_ci else SKIP
    paths = find_templates(args.templates)
    if args.only:
        paths = [p for p in paths if os.path.basename(p)[:-len(".jinja")] in set(args.only)]
    if not paths:
        print("compare_templates: no templates found (scripts/setup extracts them into .cache/templates)")
        return 1 if in_ci else SKIP
    if not os.path.exists(args.pagoda):
        print(f"compare_templates: {args.pagoda} not built")
        return 1

    if args.write_fixture:
        cases = []
        for path in paths:
            source = open(path, encoding="utf-8").read()
            for conv in CONVERSATIONS:
                ok, out = render_oracle(env, source, conv)
                cases.append({"template": os.path.basename(path), "conversation": conv["name"],
                              "messages": conv["messages"], "tools": conv["tools"],
                              "add_generation_prompt": conv["gen"], "bos": BOS, "eos": EOS, "now": NOW,
                              "expected": out if ok else None, "error": None if ok else out})
        with open(args.write_fixture, "w", encoding="utf-8") as f:
            json.dump(cases, f, ensure_ascii=False, indent=1)
            f.write("\n")
        print(f"wrote {len(cases)} cases to {args.write_fixture}")
        return 0

    identical, unsupported, mismatched = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for path in paths:
            name = os.path.basename(path)
            source = open(path, encoding="utf-8").read()
            status, detail = "identical", ""
            for conv in CONVERSATIONS:
                ok_o, out_o = render_oracle(env, source, conv)
                ok_s, out_s = render_subject(args.pagoda, tmp, path, conv)
                if ok_o and ok_s and out_o == out_s:
                    continue
                if not ok_o and not ok_s:
                    continue  # both refuse (raise_exception, unsupported role...)
                if ok_o and not ok_s:
                    if status == "identical":
                        status, detail = "unsupported", f"{conv['name']}: {out_s}"
                    continue
                status = "MISMATCH"
                if ok_s and not ok_o:
                    detail = f"{conv['name']}: jinja2 raised ({out_o}) but pagoda rendered"
                else:
                    i = next((k for k in range(min(len(out_o), len(out_s))) if out_o[k] != out_s[k]),
                             min(len(out_o), len(out_s)))
                    detail = (f"{conv['name']}: differs at char {i}: jinja2 {out_o[max(0, i - 40):i + 40]!r} "
                              f"pagoda {out_s[max(0, i - 40):i + 40]!r}")
                break
            {"identical": identical, "unsupported": unsupported, "MISMATCH": mismatched}[status].append(name)
            if status != "identical" or args.verbose:
                print(f"{status:11s} {name}" + (f"  -- {detail}" if detail else ""))
    n = len(paths)
    print(f"\n{len(identical)}/{n} identical ({100.0 * len(identical) / n:.1f}%), "
          f"{len(unsupported)} unsupported (refused with an error), {len(mismatched)} mismatched")
    if mismatched:
        return 1
    return 0 if len(identical) >= args.min_identical * n else 1


if __name__ == "__main__":
    sys.exit(main())
