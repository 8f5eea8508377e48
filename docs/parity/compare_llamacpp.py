#!/usr/bin/env python3
"""Greedy parity of pagoda against llama.cpp on the same GGUF file (issues #3, #4).

For each of 8 fixed prompts (4 chat prompts through the model's chat template,
exactly as `pagoda run --chat` renders them, and 4 plain-text completions):

  * pagoda (`pagoda run --temp 0 --ignore-eos --json --logits-out`, default cpu
    kernels, f16 KV unless told otherwise) generates 32 greedy tokens;
  * llama.cpp (through the llama-cpp-python ctypes bindings, low-level API,
    llama.cpp's default context parameters: f16 KV, flash attention AUTO) is fed
    the SAME prompt token ids (pagoda's) and generates 32 tokens by argmax;
  * position i matches when both engines produced the same id there; after a
    divergence each engine continues on its own greedy path, so later positions
    may match again. The first divergence index is reported too;
  * the first step's logits are compared: max over the vocabulary of |diff|,
    divided by the max |logit| of llama.cpp;
  * llama.cpp's own tokenisation of the same text (add_special, parse_special)
    is compared with pagoda's ids (reported only; the ids fed are pagoda's).

Issue #4 is measured the same way inside pagoda: --kv-dtype q8_0 against the
default f16 KV.

The prompts were fixed before any result was seen; do not tune them to the
numbers. Results go to docs/parity/results.md (markdown).

Getting llama.cpp (never commit its code or binaries here). Either
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON \
              -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" \
    pip install llama-cpp-python==0.3.36
or point PYTHONPATH at an unpacked sdist's pure-python package whose lib/ holds
libllama.so and libggml*.so built from that sdist with the flags above, e.g.
  PYTHONPATH=/tmp/lcp-py python3 docs/parity/compare_llamacpp.py --pagoda build/release/src/cli/pagoda

Usage:
  python3 docs/parity/compare_llamacpp.py --pagoda PATH/TO/pagoda [--model GGUF]
      [--threads 2] [--n 32] [--out docs/parity/results.md] [--ref-kernels]
"""
import argparse
import ctypes
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile

import numpy as np

# (kind, text). "chat": user turn through the chat template (pagoda run --chat);
# "text": plain completion (BOS handling as the model's GGUF says).
PROMPTS = [
    ("chat", "What is the capital of France?"),
    ("chat", "Write a short poem about the ocean."),
    ("chat", "Explain how a bicycle works in simple terms."),
    ("chat", "Give me three tips for learning a new language."),
    ("text", "The history of the Roman Empire"),
    ("text", "Once upon a time, in a small village,"),
    ("text", "def fibonacci(n):"),
    ("text", "Photosynthesis is the process by which"),
]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ---- pagoda -------------------------------------------------------------------
def run_pagoda(binary, model, kind, text, n, threads, extra=(), env=None):
    """Returns (json dict, first-step logits as np.float32 array)."""
    with tempfile.TemporaryDirectory() as tmp:
        lpath = os.path.join(tmp, "logits.f32")
        cmd = [binary, "run", "-m", model, "-p", text, "-n", str(n), "--temp", "0", "--ignore-eos",
               "--json", "-t", str(threads), "--logits-out", lpath]
        if kind == "chat":
            cmd.append("--chat")
        cmd += list(extra)
        r = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
        if r.returncode != 0:
            sys.exit("pagoda failed (%d): %s\n%s" % (r.returncode, " ".join(cmd), r.stderr))
        j = json.loads(r.stdout)
        logits = np.fromfile(lpath, dtype="<f4")
    return j, logits


# ---- llama.cpp ----------------------------------------------------------------
class LlamaCpp:
    def __init__(self, model, threads, n_ctx=512, flash_attn_disabled=False):
        import llama_cpp as L  # noqa: N812 (the bindings' own naming)

        self.L = L
        self._log_cb = L.llama_log_callback(lambda level, text, user: None)
        L.llama_log_set(self._log_cb, ctypes.c_void_p())
        L.llama_backend_init()
        mp = L.llama_model_default_params()
        self.model = L.llama_model_load_from_file(model.encode(), mp)
        if not self.model:
            sys.exit("llama.cpp could not load " + model)
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        cp = L.llama_context_default_params()  # llama.cpp's defaults: f16 K/V, flash_attn_type AUTO
        if flash_attn_disabled:
            cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        self.flash_attn = (L.llama_flash_attn_type_name(cp.flash_attn_type) or b"?").decode()
        cp.n_ctx = n_ctx
        cp.n_batch = n_ctx
        cp.n_ubatch = n_ctx
        cp.n_threads = threads
        cp.n_threads_batch = threads
        self.ctx = L.llama_init_from_model(self.model, cp)
        if not self.ctx:
            sys.exit("llama.cpp could not create a context")
        self.system_info = L.llama_print_system_info().decode()

    def tokenize(self, text):
        L = self.L
        data = text.encode()
        buf = (L.llama_token * (len(data) + 16))()
        n = L.llama_tokenize(self.vocab, data, len(data), buf, len(buf), True, True)
        if n < 0:
            sys.exit("llama_tokenize failed")
        return list(buf[:n])

    def detokenize(self, ids):
        L = self.L
        arr = (L.llama_token * len(ids))(*ids)
        out = ctypes.create_string_buffer(64 * len(ids) + 64)
        n = L.llama_detokenize(self.vocab, arr, len(ids), out, len(out), False, False)
        return out.raw[: max(n, 0)].decode("utf-8", errors="replace")

    def _decode(self, ids):
        L = self.L
        arr = (L.llama_token * len(ids))(*ids)
        if L.llama_decode(self.ctx, L.llama_batch_get_one(arr, len(ids))) != 0:
            sys.exit("llama_decode failed")
        ptr = L.llama_get_logits_ith(self.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()

    def greedy(self, prompt_ids, n):
        """Returns (generated ids, first-step logits, top-2 logit gap of every step).
        Ties go to the lowest id."""
        L = self.L
        L.llama_memory_clear(L.llama_get_memory(self.ctx), True)
        logits = self._decode(prompt_ids)
        first = logits
        out, gaps = [], []
        for i in range(n):
            t = int(np.argmax(logits))
            out.append(t)
            gaps.append(top2_gap(logits))
            if i + 1 < n:
                logits = self._decode([t])
        return out, first, gaps


# ---- comparison -----------------------------------------------------------------
def compare(a, b):
    """(matching positions, first divergence index or None)."""
    m = sum(1 for x, y in zip(a, b) if x == y)
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    return m, first


def rel_max_diff(test, ref):
    return float(np.max(np.abs(test - ref)) / np.max(np.abs(ref)))


def top2_gap(logits):
    s = np.sort(logits)
    return float(s[-1] - s[-2])


def md_escape(s, limit=60):
    s = s.replace("\n", "\\n").replace("|", "\\|")
    return s if len(s) <= limit else s[: limit - 1] + "…"


def git_rev():
    try:
        rev = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return rev + (" + uncommitted changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pagoda", required=True, help="path of the pagoda binary")
    ap.add_argument("--model", default=os.path.join(REPO, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n", type=int, default=32, help="greedy tokens per prompt")
    ap.add_argument("--out", default=os.path.join(REPO, "docs", "parity", "results.md"))
    ap.add_argument("--ref-kernels", action="store_true",
                    help="also compare pagoda --ref-kernels (exact f32 scalar kernels) with llama.cpp")
    ap.add_argument("--skip-kv-q8", action="store_true", help="skip the q8_0-vs-f16 KV runs (issue #4)")
    ap.add_argument("--no-calibration", action="store_true",
                    help="skip the noise-floor runs (llama.cpp flash attention off vs on, pagoda AVX2 vs AVX-512)")
    args = ap.parse_args()

    lc = LlamaCpp(args.model, args.threads)
    lc_nofa = None if args.no_calibration else LlamaCpp(args.model, args.threads, flash_attn_disabled=True)
    rows, kv_rows, ref_rows, cal_rows = [], [], [], []
    for kind, text in PROMPTS:
        pj, plog = run_pagoda(args.pagoda, args.model, kind, text, args.n, args.threads)
        ids = pj["prompt_tokens"]
        ptext = pj.get("prompt_text", text)
        lgen, llog, lgaps = lc.greedy(ids, args.n)
        pgen = pj["generated_tokens"]
        m, first = compare(pgen, lgen)
        rows.append(dict(kind=kind, text=text, n_prompt=len(ids), tok_equal=lc.tokenize(ptext) == ids,
                         match=m, first=first, rel=rel_max_diff(plog, llog), top1=int(np.argmax(plog)) == int(
                             np.argmax(llog)), gap=lgaps[0], div_gap=None if first is None else lgaps[first], ptext=pj["text"], ltext=lc.detokenize(lgen)))
        if args.skip_kv_q8:
            qj, qlog = pj, plog
        else:
            qj, qlog = run_pagoda(args.pagoda, args.model, kind, text, args.n, args.threads, ["--kv-dtype", "q8_0"])
        qm, qfirst = compare(qj["generated_tokens"], pgen)
        kv_rows.append(dict(kind=kind, text=text, match=qm, first=qfirst, rel=rel_max_diff(qlog, plog),
                            qtext=qj["text"]))
        if lc_nofa is not None:
            fgen, flog, _ = lc_nofa.greedy(ids, args.n)
            fm, ffirst = compare(fgen, lgen)
            env = dict(os.environ, PAGODA_ISA="avx2")
            aj, alog = run_pagoda(args.pagoda, args.model, kind, text, args.n, args.threads, env=env)
            am, afirst = compare(aj["generated_tokens"], pgen)
            cal_rows.append(dict(kind=kind, text=text, fa_match=fm, fa_first=ffirst, fa_rel=rel_max_diff(flog, llog),
                                 isa_match=am, isa_first=afirst, isa_rel=rel_max_diff(alog, plog)))
        if args.ref_kernels:
            rj, rlog = run_pagoda(args.pagoda, args.model, kind, text, args.n, args.threads, ["--ref-kernels"])
            rm, rfirst = compare(rj["generated_tokens"], lgen)
            ref_rows.append(dict(kind=kind, text=text, match=rm, first=rfirst, rel=rel_max_diff(rlog, llog)))
        print("%-4s %-48s llama.cpp %2d/%d (first diff %s, logits %.4f)  q8_0-vs-f16 %2d/%d" %
              (kind, text[:48], m, args.n, first, rows[-1]["rel"], qm, args.n), flush=True)

    n = args.n
    ok3 = all(r["match"] >= n - 2 and r["rel"] <= 0.02 for r in rows)
    ok4 = all(r["match"] >= n - 4 for r in kv_rows)
    L = []
    L.append("# pagoda vs llama.cpp: greedy parity on SmolLM2-135M-Instruct Q4_1\n")
    L.append("Generated by `docs/parity/compare_llamacpp.py` on %s. Do not edit by hand.\n" %
             datetime.date.today().isoformat())
    L.append("- model: `%s`" % os.path.relpath(args.model, REPO))
    L.append("- pagoda: `%s` (commit %s), default cpu kernels, f16 KV, %d threads, `--temp 0 --ignore-eos`" %
             (os.path.relpath(args.pagoda, REPO), git_rev(), args.threads))
    L.append("- llama.cpp: llama-cpp-python 0.3.36 bindings, default context params (f16 K/V, flash_attn=%s), "
             "%d threads, argmax each step, fed pagoda's prompt ids" % (lc.flash_attn, args.threads))
    L.append("- llama.cpp system info: `%s`" % lc.system_info.strip())
    L.append("- machine: %s, Python %s\n" % (platform.machine(), platform.python_version()))
    L.append("## Issue #3: pagoda vs llama.cpp (%d greedy tokens)\n" % n)
    L.append("Criterion: >= %d/%d matching positions on every prompt and first-step logits within 2%% "
             "(max |diff| / max |logit|). **%s**\n" % (n - 2, n, "met" if ok3 else "not met"))
    L.append("| # | kind | prompt | prompt tokens | llama.cpp tokenises the same | matching | first divergence | "
             "llama.cpp top-2 gap there | first-step logits rel. max diff | same first token | "
             "llama.cpp first-step top-2 gap |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for i, r in enumerate(rows):
        L.append("| %d | %s | %s | %d | %s | %d/%d | %s | %s | %.4f | %s | %.3f |" %
                 (i + 1, r["kind"], md_escape(r["text"]), r["n_prompt"], "yes" if r["tok_equal"] else "no",
                  r["match"], n, "-" if r["first"] is None else r["first"],
                  "-" if r["div_gap"] is None else "%.3f" % r["div_gap"], r["rel"], "yes" if r["top1"] else "no",
                  r["gap"]))
    L.append("")
    L.append("## Issue #4: pagoda --kv-dtype q8_0 vs f16 KV (%d greedy tokens)\n" % n)
    L.append("Criterion: >= %d/%d matching positions on every prompt. **%s**\n" % (n - 4, n,
                                                                                  "met" if ok4 else "not met"))
    L.append("| # | kind | prompt | matching | first divergence | first-step logits rel. max diff |")
    L.append("|---|---|---|---|---|---|")
    for i, r in enumerate(kv_rows):
        L.append("| %d | %s | %s | %d/%d | %s | %.4f |" % (i + 1, r["kind"], md_escape(r["text"]), r["match"], n,
                                                          "-" if r["first"] is None else r["first"], r["rel"]))
    L.append("")
    if cal_rows:
        L.append("## Noise floor: each engine against itself with a different reduction order\n")
        L.append("Same metrics between two configurations of ONE engine: llama.cpp with flash attention disabled vs "
                 "its default (enabled), and pagoda's AVX2 matmul path vs its AVX-512 path (`PAGODA_ISA=avx2`; "
                 "the two differ only in the order of float additions). Greedy decoding of this 8-bit-activation "
                 "model amplifies last-bit differences (a changed rounding of one int8 activation changes the "
                 "next layer's input), so numbers here show the best any independent implementation can expect "
                 "without bit-for-bit emulation.\n")
        L.append("| # | kind | prompt | llama.cpp FA off vs on: matching | first divergence | logits rel. max diff | "
                 "pagoda AVX2 vs AVX-512: matching | first divergence | logits rel. max diff |")
        L.append("|---|---|---|---|---|---|---|---|---|")
        for i, r in enumerate(cal_rows):
            L.append("| %d | %s | %s | %d/%d | %s | %.4f | %d/%d | %s | %.4f |" % (
                i + 1, r["kind"], md_escape(r["text"]), r["fa_match"], n,
                "-" if r["fa_first"] is None else r["fa_first"], r["fa_rel"], r["isa_match"], n,
                "-" if r["isa_first"] is None else r["isa_first"], r["isa_rel"]))
        L.append("")
    if ref_rows:
        L.append("## For comparison: pagoda --ref-kernels (scalar f32 oracles) vs llama.cpp\n")
        L.append("| # | kind | prompt | matching | first divergence | logits rel. max diff |")
        L.append("|---|---|---|---|---|---|")
        for i, r in enumerate(ref_rows):
            L.append("| %d | %s | %s | %d/%d | %s | %.4f |" % (i + 1, r["kind"], md_escape(r["text"]), r["match"],
                                                              n, "-" if r["first"] is None else r["first"], r["rel"]))
        L.append("")
    L.append("## Generated text\n")
    for i, (r, q) in enumerate(zip(rows, kv_rows)):
        L.append("%d. %s `%s`" % (i + 1, r["kind"], md_escape(r["text"], 200)))
        L.append("   - pagoda f16:  `%s`" % md_escape(r["ptext"], 400))
        L.append("   - llama.cpp:   `%s`" % md_escape(r["ltext"], 400))
        L.append("   - pagoda q8_0: `%s`" % md_escape(q["qtext"], 400))
    L.append("")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        f.write("\n".join(L))
    print("wrote", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
