#!/usr/bin/env python3
"""The noise floor behind compare_lfm2.py's Q8_0 misses (issue 38). On one GGUF and some
of compare_lfm2.py's prompts: llama.cpp (f16 cache) generates 32 greedy tokens g; pagoda is
teacher-forced on g with its f16 cache, its f32 cache and, with --ref, --ref-kernels (every
weight row dequantized to f32, sums in double: no activation quantization). Prints, for
every pair, the relative L2 difference of the logits (mean and max over the 32 positions),
the cosine (min and mean) and on how many positions the two argmaxes agree. If pagoda's
two caches disagree with each other about as often as pagoda disagrees with llama.cpp, the
misses are the file's noise floor rather than a divergence.

  LD_LIBRARY_PATH=/work/llama.cpp/build-avx512/bin LLAMA_CPP_LIB_PATH=/work/llama.cpp/build-avx512/bin \\
  PYTHONPATH=/tmp/q35py LLAMA_NO_EXTRA_BUFTS=1 python3 docs/parity/q8_noise.py \\
      --pagoda build/release/src/cli/pagoda --model q35_q8.gguf --prompts 0,1 [--ref]
  (the file from `pagoda synth --preset qwen3.5-0.8b --type q8_0 -o q35_q8.gguf`)
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_llamacpp import LlamaCpp, pagoda_forced  # noqa: E402
from compare_arch import N_GEN, cosine  # noqa: E402
from compare_lfm2 import prompts  # noqa: E402


def stats(x, y):
    rel = [float(np.linalg.norm(x[j] - y[j]) / np.linalg.norm(y[j])) for j in range(N_GEN)]
    cs = [cosine(x[j], y[j]) for j in range(N_GEN)]
    agree = sum(int(np.argmax(x[j])) == int(np.argmax(y[j])) for j in range(N_GEN))
    return "rel L2 mean %.2e max %.2e, cosine min %.6f mean %.6f, same top-1 %d/%d" % (
        np.mean(rel), max(rel), min(cs), np.mean(cs), agree, N_GEN)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pagoda", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", default="0,1", help="indices into compare_lfm2.py's 8 prompts")
    ap.add_argument("--ref", action="store_true", help="also pagoda --ref-kernels (slow)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    llm = LlamaCpp(args.model, args.threads, n_ctx=512)
    all_prompts = prompts(llm.n_vocab)
    for i in [int(x) for x in args.prompts.split(",")]:
        ids = all_prompts[i]
        g, ref, _ = llm.greedy(ids, N_GEN)
        runs = {"llama.cpp f16": ref}
        for name, extra in [("pagoda f16", ["--kv-dtype", "f16"]), ("pagoda f32", ["--kv-dtype", "f32"])] + (
                [("pagoda ref f16", ["--kv-dtype", "f16", "--ref-kernels"])] if args.ref else []):
            runs[name] = pagoda_forced(args.pagoda, args.model, ids, g, args.threads, extra=["-c", "512"] + extra)
        print("prompt %d (%d tokens)" % (i, len(ids)), flush=True)
        names = list(runs)
        for a in range(len(names)):
            for b in range(a + 1, len(names)):
                print("  %s vs %s: %s" % (names[a], names[b], stats(runs[names[a]], runs[names[b]])), flush=True)


if __name__ == "__main__":
    main()
