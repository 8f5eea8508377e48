#!/usr/bin/env python3
"""Parity of pagoda's newer architectures against llama.cpp (issue 14).

Two parts, both on the same GGUF files in both engines, prompt token ids fed
identically (llama.cpp's tokenization, given to pagoda as --prompt-ids):

gemma3 (the real Gemma 3 270M Q4_K_M, `scripts/setup` fetches it): teacher-forced
  top-1, the method of compare_llamacpp.py. For each of 8 fixed prompts (6 short,
  2 longer than 1,500 tokens, so the 512-token sliding window of the local layers
  is exercised), llama.cpp generates 32 greedy tokens g_0..g_31; pagoda is
  prefilled with the prompt and fed g_0..g_{i-1} (`pagoda run --force-tokens`),
  and position i agrees when pagoda's argmax is g_i. Reported per prompt, with
  the near-ties (llama.cpp's top-2 gap below 2% of its max |logit|).

synth (qwen3, llama with llama-3.x rope scaling, phi3 with LongRoPE, gemma3):
  `pagoda synth --preset` files (Q8_0, --layers N to keep the run short), and
  4 prompts x 64 positions of random token ids: per position, the cosine of the
  two logit vectors and top-1 agreement (pagoda teacher-forced on the prompt,
  llama.cpp decoding it one token at a time: both produce the logits after each
  of positions 0..62). --fixtures DIR also writes the small synth models' reference
  logits (FIXTURES: the tiny-* presets, F32, YaRN and phi3's long factors too) for
  tests/model/test_arch_llamacpp.cc, which checks them without llama.cpp.

Getting llama.cpp: see compare_llamacpp.py (never commit its code or binaries).
  PYTHONPATH=/tmp/lcp-py python3 docs/parity/compare_arch.py --pagoda build/release/src/cli/pagoda \\
      --gemma models/gemma-3-270m-q4_k_m.gguf [--synth] [--fixtures tests/data/arch_parity]
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_llamacpp import REPO, LlamaCpp, git_rev, pagoda_forced, top2_gap  # noqa: E402

NEAR_TIE = 0.02
N_GEN = 32

# Fixed before any result was seen. The two long prompts are repository documents
# (their first 4,000 and 6,000 characters at the commit the results name; the second
# was 4,000 until session 6 made it longer than 1,500 tokens, as issue 14 asks).
SHORT_PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "<start_of_turn>user\nWhat are the three primary colors?<end_of_turn>\n<start_of_turn>model\n",
    "<start_of_turn>user\nWrite a haiku about autumn leaves.<end_of_turn>\n<start_of_turn>model\n",
    "Photosynthesis is the process by which plants",
]
LONG_DOCS = [("docs/sizing-example.md", 4000), ("docs/load-test.md", 6000)]
EXACT_MAX_TOKENS = 64  # pagoda's scalar reference kernels only on the short prompts (minutes otherwise)


def gemma_prompts():
    out = [("short %d" % i, p) for i, p in enumerate(SHORT_PROMPTS)]
    for d, n in LONG_DOCS:
        with open(os.path.join(REPO, d), encoding="utf-8") as f:
            out.append(("long " + d, f.read()[:n]))
    return out


def teacher_forced_score(test, g, ref_logits, gaps):
    """(top-1 agreements, misses that are near-ties, min cosine) of pagoda's logits
    test [N_GEN, n_vocab] against llama.cpp's greedy tokens g and logits."""
    agree = near_tie_miss = 0
    for i in range(N_GEN):
        if int(np.argmax(test[i])) == g[i]:
            agree += 1
        elif gaps[i] < NEAR_TIE * float(np.max(np.abs(ref_logits[i]))):
            near_tie_miss += 1
    return agree, near_tie_miss, min(cosine(test[i], ref_logits[i]) for i in range(N_GEN))


def gemma_section(args):
    """Per prompt, teacher-forced top-1 of:
      pagoda (default kernels, f16 KV) on llama.cpp's greedy tokens, llama.cpp with its
        default context (flash attention AUTO, on for this CPU: the issue's criterion)
        and with flash attention off (its own greedy tokens);
      llama.cpp with flash attention off, forced on the default's tokens: the noise
        floor between two configurations of llama.cpp itself;
      pagoda with f32 KV (default kernels) on the default's tokens;
      on the short prompts, the exact computation (pagoda --ref-kernels --kv-dtype f32:
        f32 activations, exact dequantization, double sums) forced on each llama.cpp
        mode's tokens, so each engine's top-1 can be scored against it, and pagoda's
        own (f16 KV) top-1 against it on the default's tokens."""
    rows = []
    runs = {}
    lc = {}
    for fa_off in (False, True):
        lc[fa_off] = LlamaCpp(args.gemma, args.threads, n_ctx=4096, flash_attn_disabled=fa_off)
    for name, text in gemma_prompts():
        ids = lc[False].tokenize(text)
        for fa_off in (False, True):
            runs[(name, fa_off)] = (ids,) + tuple(lc[fa_off].greedy(ids, N_GEN))
        g_on = runs[(name, False)][1]
        g_off_forced, _, _ = lc[True].greedy(ids, N_GEN, forced=g_on)
        runs[(name, "floor")] = sum(int(a == b) for a, b in zip(g_off_forced, g_on))
    del lc
    ctx = ["-c", "4096"]
    for name, _ in gemma_prompts():
        ids, g, ref_logits, gaps = runs[(name, False)]
        test = pagoda_forced(args.pagoda, args.gemma, ids, g, args.threads, extra=ctx)
        agree, near, mincos = teacher_forced_score(test, g, ref_logits, gaps)
        _, g2, ref2, gaps2 = runs[(name, True)]
        test2 = pagoda_forced(args.pagoda, args.gemma, ids, g2, args.threads, extra=ctx)
        agree2, near2, mincos2 = teacher_forced_score(test2, g2, ref2, gaps2)
        f32kv = pagoda_forced(args.pagoda, args.gemma, ids, g, args.threads, extra=ctx + ["--kv-dtype", "f32"])
        agree_f32kv = sum(int(np.argmax(f32kv[i])) == g[i] for i in range(N_GEN))
        floor = runs[(name, "floor")]
        exact = None  # (llama.cpp default = exact, llama.cpp fa off = exact, pagoda = exact, pagoda f32 KV = exact)
        if len(ids) <= EXACT_MAX_TOKENS and not args.no_exact:
            ref_kv = ctx + ["--ref-kernels", "--kv-dtype", "f32"]
            ex = np.argmax(pagoda_forced(args.pagoda, args.gemma, ids, g, args.threads, extra=ref_kv), axis=1)
            ex2 = np.argmax(pagoda_forced(args.pagoda, args.gemma, ids, g2, args.threads, extra=ref_kv), axis=1)
            exact = (sum(int(ex[i] == g[i]) for i in range(N_GEN)), sum(int(ex2[i] == g2[i]) for i in range(N_GEN)),
                     sum(int(ex[i] == np.argmax(test[i])) for i in range(N_GEN)),
                     sum(int(ex[i] == np.argmax(f32kv[i])) for i in range(N_GEN)))
            misses = [i for i in range(N_GEN) if int(np.argmax(test[i])) != g[i]]
            print("  %s misses vs llama.cpp default at %s; exact's token there: %s" % (
                name, misses, ["llama.cpp" if ex[i] == g[i] else "pagoda" if ex[i] == np.argmax(test[i])
                               else "neither" for i in misses]), flush=True)
        rows.append((name, len(ids), agree, near, mincos, agree2, near2, mincos2, floor, agree_f32kv, exact))
        print("gemma3 %-28s %5d tokens: top-1 %2d/%d (near-tie misses %d), min cosine %.6f | fa off: "
              "%2d/%d (near-tie misses %d), min cosine %.6f | llama.cpp fa off forced on fa on: %2d/%d | "
              "pagoda f32 KV %2d/%d | exact = llama.cpp default, = llama.cpp fa off, = pagoda, = pagoda f32 KV: %s" %
              (name, len(ids), agree, N_GEN, near, mincos, agree2, N_GEN, near2, mincos2, floor, N_GEN,
               agree_f32kv, N_GEN, "-" if exact is None else "%d, %d, %d, %d /%d" % (exact + (N_GEN,))), flush=True)
    return rows


def kv_precision_section(args):
    """On one prompt (--kv-study N: SHORT_PROMPTS[N], tokenized by pagoda):
    the exact computation (--ref-kernels --kv-dtype f32) generates N_GEN greedy tokens;
    then the scalar reference kernels with f16 KV, the default kernels with f32 KV and
    the default kernels with f16 KV (pagoda's default) are teacher-forced on them. Per
    configuration: top-1 agreement with the exact tokens, and per position the largest
    |logit - exact logit| relative to the exact max |logit|. If the default f16-KV path
    had a precision bug beyond storing K/V in f16, it would sit far from the reference
    kernels with f16 KV (which round K/V the same way and nothing else). With
    --kv-study-llamacpp, llama.cpp (flash attention on, off) is scored the same way."""
    text = SHORT_PROMPTS[args.kv_study]
    r = subprocess.run([args.pagoda, "run", "-m", args.gemma, "-p", text, "-n", "1", "--temp", "0", "--json", "-t",
                        "1", "-c", "4096"], capture_output=True, text=True, check=True)
    ids = json.loads(r.stdout)["prompt_tokens"]
    ctx = ["-c", "4096"]
    ref_kv = ctx + ["--ref-kernels", "--kv-dtype", "f32"]
    # greedy exact tokens: forced decoding of argmax needs the tokens first, so run free
    cmd = [args.pagoda, "run", "-m", args.gemma, "--prompt-ids", ",".join(map(str, ids)), "-n", str(N_GEN),
           "--temp", "0", "--ignore-eos", "--json", "-t", str(args.threads)] + ref_kv
    e = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)["generated_tokens"]
    exact = pagoda_forced(args.pagoda, args.gemma, ids, e, args.threads, extra=ref_kv)
    assert all(int(np.argmax(exact[i])) == e[i] for i in range(N_GEN))
    configs = [("ref kernels, f16 KV", ["--ref-kernels"]), ("default kernels, f32 KV", ["--kv-dtype", "f32"]),
               ("default kernels, f16 KV (pagoda's default)", [])]
    print("prompt %r, %d tokens; exact greedy: %s" % (text, len(ids), e))
    scale = np.max(np.abs(exact), axis=1)
    forced = [(name, pagoda_forced(args.pagoda, args.gemma, ids, e, args.threads, extra=ctx + extra))
              for name, extra in configs]
    if args.kv_study_llamacpp:  # llama.cpp, both flash-attention settings, forced on the same tokens
        for fa_off in (False, True):
            llm = LlamaCpp(args.gemma, args.threads, n_ctx=4096, flash_attn_disabled=fa_off)
            forced.append(("llama.cpp, flash attention " + ("off" if fa_off else llm.flash_attn),
                           llm.greedy(ids, N_GEN, forced=e)[1]))
            del llm
    for name, t in forced:
        rel = np.max(np.abs(t - exact), axis=1) / scale
        miss = [i for i in range(N_GEN) if int(np.argmax(t[i])) != e[i]]
        gaps = ["%d: gap %.4f" % (i, (exact[i][e[i]] - exact[i][int(np.argmax(t[i]))]) / scale[i]) for i in miss]
        print("%-44s top-1 = exact %2d/%d; max rel logit error median %.2e max %.2e; misses (exact's own margin "
              "over the picked token, / max|logit|): %s" % (name, N_GEN - len(miss), N_GEN, float(np.median(rel)),
                                                           float(np.max(rel)), gaps or "-"), flush=True)


def pagoda_greedy(binary, model, prompt_ids, n, threads):
    """pagoda's own greedy continuation (free-running): its generated token ids."""
    cmd = [binary, "run", "-m", model, "--prompt-ids", ",".join(str(t) for t in prompt_ids), "-n", str(n),
           "--temp", "0", "--ignore-eos", "--json", "-t", str(threads), "-c", "4096"]
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(r.stdout)["generated_tokens"]


def free_running_section(args):
    """Markdown rows: per prompt, llama.cpp's and pagoda's greedy continuations (N_GEN
    tokens each, both free-running from the same prompt ids) and where they part."""
    llm = LlamaCpp(args.gemma, args.threads, n_ctx=4096)
    print("| prompt | same first tokens | llama.cpp | pagoda |\n|---|---|---|---|")
    for name, text in gemma_prompts():
        ids = llm.tokenize(text)
        g, _, _ = llm.greedy(ids, N_GEN)
        p = pagoda_greedy(args.pagoda, args.gemma, ids, N_GEN, args.threads)
        same = next((i for i in range(N_GEN) if g[i] != p[i]), N_GEN)
        show = lambda t: "`" + llm.detokenize(t).replace("\n", "\\n").replace("|", "\\|").replace("`", "'") + "`"
        print("| %s | %d/%d | %s | %s |" % (name, same, N_GEN, show(g), show(p)), flush=True)


def cosine(a, b):
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def prompts_for(n_vocab, n_prompts=4, n_pos=64, seed=14):
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(0, n_vocab, size=n_pos)] for _ in range(n_prompts)]


def llama_per_position(llm, ids):
    """llama.cpp's logits after each of positions 0..len(ids)-2: [len(ids)-1, n_vocab]."""
    L = llm.L
    L.llama_memory_clear(L.llama_get_memory(llm.ctx), True)
    out = []
    for t in ids[:-1]:
        out.append(llm._decode([t]))
    return np.stack(out)


def per_position(args, model, prompts, ctx=256):
    """Returns (min cosine, mean cosine, top-1 agreements, positions, llama.cpp logits
    per prompt, disagreements that are not near-ties)."""
    llm = LlamaCpp(model, args.threads, n_ctx=ctx)
    cos, top1, n, hard = [], 0, 0, 0
    refs = []
    for ids in prompts:
        ref = llama_per_position(llm, ids)
        test = pagoda_forced(args.pagoda, model, ids[:1], ids[1:], args.threads, extra=["-c", str(ctx)])
        refs.append(ref)
        for i in range(len(ids) - 1):
            cos.append(cosine(test[i], ref[i]))
            same = int(np.argmax(test[i]) == np.argmax(ref[i]))
            top1 += same
            if not same and top2_gap(ref[i]) >= NEAR_TIE * float(np.max(np.abs(ref[i]))):
                hard += 1
            n += 1
    return min(cos), float(np.mean(cos)), top1, n, refs, hard


SYNTH = [  # preset, layers
    ("qwen3-0.6b", 4),
    ("llama-3.2-1b", 4),
    ("phi-3-mini-128k", 4),
    ("gemma3-270m", 6),
]


def synth_section(args, tmp):
    rows = []
    for preset, layers in SYNTH:
        layers = args.synth_layers or layers
        path = os.path.join(tmp, preset + ".gguf")
        subprocess.run([args.pagoda, "synth", "--preset", preset, "--type", args.synth_type, "--layers",
                        str(layers), "-o", path], check=True, capture_output=True)
        n_vocab = LlamaCpp(path, args.threads, n_ctx=256).n_vocab
        mn, mean, top1, n, _, hard = per_position(args, path, prompts_for(n_vocab))
        rows.append((preset, layers, mn, mean, top1, n))
        print("synth %-16s %s %d layers: cosine min %.6f mean %.6f, top-1 %d/%d (misses not near-ties: %d)" %
              (preset, args.synth_type, layers, mn, mean, top1, n, hard), flush=True)
        os.remove(path)
    return rows


# The fixtures tests/model/test_arch_llamacpp.cc checks: (name, tiny synth preset,
# context length given to both engines). phi3-long is tiny-phi3 at a context past its
# original 256, where both take rope_factors_long.
FIXTURES = [("qwen3", "tiny-qwen3", 256), ("qwen3-yarn", "tiny-qwen3-yarn", 256), ("llama3", "tiny-llama3", 256),
            ("phi3", "tiny-phi3", 256), ("phi3-long", "tiny-phi3", 512), ("gemma3", "tiny-gemma3", 256),
            ("lfm2", "tiny-lfm2", 256), ("qwen35", "tiny-qwen35", 256), ("mamba2", "tiny-mamba2", 256)]


def write_fixture(path, prompts, refs):
    """Little-endian: 'PGAP', u32 n_prompts, u32 n_pos, u32 n_vocab, i32 tokens
    [n_prompts, n_pos], f16 logits [n_prompts, n_pos - 1, n_vocab]."""
    n_pos, n_vocab = len(prompts[0]), refs[0].shape[1]
    with open(path, "wb") as f:
        f.write(b"PGAP" + struct.pack("<III", len(prompts), n_pos, n_vocab))
        f.write(np.asarray(prompts, dtype="<i4").tobytes())
        for r in refs:
            f.write(r.astype("<f2").tobytes())


def fixtures_section(args, tmp):
    os.makedirs(args.fixtures, exist_ok=True)
    for name, preset, ctx in FIXTURES:
        if args.only and name not in args.only.split(","):
            continue
        path = os.path.join(tmp, preset + ".gguf")
        subprocess.run([args.pagoda, "synth", "--preset", preset, "--type", "f32", "-o", path], check=True,
                       capture_output=True)
        n_vocab = LlamaCpp(path, args.threads, n_ctx=ctx).n_vocab
        prompts = prompts_for(n_vocab)
        mn, mean, top1, n, refs, _ = per_position(args, path, prompts, ctx=ctx)
        write_fixture(os.path.join(args.fixtures, name + ".bin"), prompts, refs)
        print("%-10s (%s, context %d) cosine min %.6f mean %.6f, top-1 %d/%d (fixture written)" %
              (name, preset, ctx, mn, mean, top1, n), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pagoda", required=True)
    ap.add_argument("--gemma", default=None)
    ap.add_argument("--free-running", action="store_true",
                    help="with --gemma: only the free-running outputs side by side (markdown)")
    ap.add_argument("--no-exact", action="store_true",
                    help="with --gemma: skip the exact-computation columns (scalar reference kernels: minutes per prompt)")
    ap.add_argument("--kv-study", type=int, default=None,
                    help="with --gemma: pagoda's f16/f32 KV and kernels against the exact computation on "
                         "SHORT_PROMPTS[N] (no llama.cpp needed)")
    ap.add_argument("--kv-study-llamacpp", action="store_true",
                    help="with --kv-study: llama.cpp (flash attention on and off) forced on the same tokens too")
    ap.add_argument("--synth", action="store_true")
    ap.add_argument("--synth-type", default="q8_0")
    ap.add_argument("--synth-layers", type=int, default=0, help="override the layer counts of SYNTH")
    ap.add_argument("--fixtures", default=None)
    ap.add_argument("--only", default="", help="comma-separated fixture names to (re)write (default: all)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    print("pagoda %s" % git_rev(), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        if args.gemma and args.kv_study is not None:
            kv_precision_section(args)
        elif args.gemma and args.free_running:
            free_running_section(args)
        elif args.gemma:
            gemma_section(args)
        if args.synth:
            synth_section(args, tmp)
        if args.fixtures:
            fixtures_section(args, tmp)


if __name__ == "__main__":
    main()
