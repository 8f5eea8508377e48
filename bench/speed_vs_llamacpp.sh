#!/bin/bash
# Side-by-side pp512 / tg128 against llama.cpp's llama-bench, same files, 2 threads,
# interleaved rounds (each engine -r 5 per round; both with their default thread waits).
# Usage: bench/speed_vs_llamacpp.sh LLAMA_BIN_DIR ROUNDS MODEL...
# llama.cpp is built outside the tree from the llama-cpp-python sdist (see docs/benchmarks.md).
set -u
L="$1/llama-bench"; ROUNDS="$2"; shift 2
. "$(dirname "$0")/common.sh"
for M in "$@"; do
  for round in $(seq 1 "$ROUNDS"); do
    round_banner "$(basename "$M") round $round"
    timeout 900 "$L" -m "$M" -p 512 -n 128 -t 2 -r 5 -o md 2>/dev/null | grep -E 'pp512|tg128' | sed 's/^/llama.cpp /'
    timeout 900 "$P" bench -m "$M" --pp 512 --tg 128 -r 5 -t 2 2>&1 | grep -E 'pp512|tg128' | sed 's/^/pagoda /'
  done
done
