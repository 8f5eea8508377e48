#!/bin/bash
# KV cache groups on the real Gemma 3 270M (issue 15): the hybrid KV cache
# manager against --disable-hybrid-kv-cache-manager (flag), same workload.
#   bench/kv_groups_gemma3.sh [ROUNDS=3] [MODEL=models/gemma-3-270m-q4_k_m.gguf]
# Each round runs both modes, the first one alternating between rounds (so a
# change in the machine's load falls on both):
#   concurrent: 9 requests of 8,192 prompt + 256 output tokens at once in a
#     314,081,280 B pool (1,065 flag blocks of 18 layers: two such requests
#     need 2 x 528; 6,390 hybrid blocks of 3 layers), chunked prefill 512;
#     prints the most running at once before any preemption and requests/s.
#   long (last round only, slow): one sequence of 32,000 tokens, blocks held.
# BENCH_KV_GROUPS overrides the binary (default: this tree's release build).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh
ROUNDS="${1:-3}"
MODEL="${2:-models/gemma-3-270m-q4_k_m.gguf}"
B="${BENCH_KV_GROUPS:-build/release/bench/bench_kv_groups}"
concurrent() { "$B" concurrent "$MODEL" 314081280 9 8192 256 --chunk 512 "$@"; }
for round in $(seq 1 "$ROUNDS"); do
  round_banner "kv groups round $round"
  if (( round % 2 )); then concurrent; concurrent --flag; else concurrent --flag; concurrent; fi
done
round_banner "kv groups long"
"$B" long "$MODEL" 32000
"$B" long "$MODEL" 32000 --flag
