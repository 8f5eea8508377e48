#!/usr/bin/env python3
"""Steady latency under bursts (issue 23): --max-num-batched-tokens auto against a fixed budget.

The issue's shared-prefix serving workload (4 groups x 16 prompts, a 1,024-token prefix per
group, 64-token suffixes, 64 output tokens, concurrency 16), run by `pagoda bench` for each
budget in turn, interleaved (the order alternates per round). Offline (one in-process engine,
the default) or through `pagoda serve` (--serve: a server per run, `pagoda bench --base-url`).
Reports per run and as medians over the rounds: TTFT p50/p99, TPOT p50/p99 and their ratio
(the issue asks p99 <= 2 x p50), ITL p99, duration, and whether the outputs were identical
(greedy: chunking never changes a token).

usage: burst_budget.py [--binary build/release/src/cli/pagoda] [--model M.gguf] [--rounds 3]
         [--budgets auto,2048] [--threads 2] [--serve] [-- extra pagoda bench flags]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "tests", "server"))

WORKLOAD = ["--workload", "shared-prefix", "--num-groups", "4", "--prompts-per-group", "16", "--prefix-len", "1024",
            "--suffix-len", "64", "--output-len", "64", "--max-concurrency", "16"]
KEYS = ["ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p50", "tpot_ms_p99", "itl_ms_p50", "itl_ms_p99", "duration_s",
        "output_tokens_per_s"]


def engine_flags(budget, threads):
    return ["-t", str(threads), "--kv-cache-memory", "512MiB", "--max-num-batched-tokens", budget]


def run_once(a, budget, extra):
    flags = engine_flags(budget, a.threads)
    bench = [a.binary, "bench", "-m", a.model] + WORKLOAD + ["--json"] + extra
    if a.serve:
        from serverutil import PagodaServer
        with PagodaServer(a.binary, a.model, flags) as srv:
            out = subprocess.run(bench + ["--base-url", srv.url], capture_output=True, text=True, check=True).stdout
    else:
        out = subprocess.run(bench + flags, capture_output=True, text=True, check=True).stdout
    line = [ln for ln in out.splitlines() if ln.startswith("{")][-1]
    return json.loads(line)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "release", "src", "cli", "pagoda"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--budgets", default="auto,2048")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--serve", action="store_true")
    a, extra = ap.parse_known_args()
    extra = [x for x in extra if x != "--"]
    budgets = a.budgets.split(",")
    res = {b: [] for b in budgets}
    for rnd in range(a.rounds):
        order = budgets if rnd % 2 == 0 else budgets[::-1]
        for b in order:
            r = run_once(a, b, extra)
            res[b].append(r)
            print(f"round {rnd} budget {b}: " + ", ".join(f"{k} {r[k]:.1f}" for k in KEYS) +
                  f", tpot p99/p50 {r['tpot_ms_p99'] / r['tpot_ms_p50']:.2f}, hash {r.get('output_text_hash')}",
                  file=sys.stderr, flush=True)
    hashes = {r.get("output_text_hash") for b in budgets for r in res[b]}
    print(f"\nmode: {'serve' if a.serve else 'offline'}; outputs identical across every run: {len(hashes) == 1}")
    print("\n| budget | TTFT p50 (ms) | TTFT p99 (ms) | TPOT p50 (ms) | TPOT p99 (ms) | TPOT p99 / p50 | ITL p99 (ms) "
          "| duration (s) | output tok/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for b in budgets:
        med = {k: statistics.median(r[k] for r in res[b]) for k in KEYS}
        ratio = statistics.median(r["tpot_ms_p99"] / r["tpot_ms_p50"] for r in res[b])
        print(f"| {b} | {med['ttft_ms_p50']:.0f} | {med['ttft_ms_p99']:.0f} | {med['tpot_ms_p50']:.1f} | "
              f"{med['tpot_ms_p99']:.1f} | {ratio:.2f} | {med['itl_ms_p99']:.0f} | {med['duration_s']:.1f} | "
              f"{med['output_tokens_per_s']:.1f} |")


if __name__ == "__main__":
    main()
