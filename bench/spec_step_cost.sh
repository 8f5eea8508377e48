#!/usr/bin/env bash
# The cost of a step by its number of tokens, for speculative decoding's verify
# steps (1 + K tokens): n sequences decoding together, offline, median TPOT per n
# (a step of n decode tokens computes n rows like a verify step of n tokens).
# usage: bench/spec_step_cost.sh [MODEL] [THREADS=2] [SIZES="1 2 3 5 9 13 17"]
set -euo pipefail
source "$(dirname "$0")/common.sh"
MODEL="${1:-$(dirname "$0")/../models/SmolLM2-135M-Instruct.Q4_1.gguf}"
THREADS="${2:-2}"
SIZES="${3:-1 2 3 5 9 13 17}"
for n in $SIZES; do
  "$P" bench -m "$MODEL" -t "$THREADS" --workload random --num-prompts "$n" --max-concurrency "$n" \
    --input-len 32 --output-len 96 --json 2>/dev/null |
    python3 -c "import json,sys; d=json.load(sys.stdin); print('tokens per step %2d: %.2f ms (tpot p50), %.1f output tok/s' % ($n, d['tpot_ms_p50'], d['output_tokens_per_s']))"
done
