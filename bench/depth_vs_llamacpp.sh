#!/bin/bash
# pp512 and tg64 at depths 0 and 4096 (issue 39) against llama.cpp's llama-bench, same files,
# 2 threads, interleaved rounds (-r 1 each per round; llama.cpp with -fa 0 and -fa 1, the
# better counts). Run it under `chrt -f 1` on a machine doing nothing else.
# Usage: bench/depth_vs_llamacpp.sh LLAMA_BIN_DIR ROUNDS MODEL...   (env DEPTHS, default 0,4096)
# llama.cpp is built outside the tree from the llama-cpp-python sdist (see docs/benchmarks.md).
set -u
L="$1/llama-bench"; ROUNDS="$2"; shift 2
D="${DEPTHS:-0,4096}"
. "$(dirname "$0")/common.sh"
depth_round() {
  timeout 1800 "$L" -m "$1" -p 512 -n 64 -d "$D" -fa 0,1 -t 2 -r 1 -o md 2>/dev/null | grep -E 'pp512|tg64' |
    sed 's/^/llama.cpp /'
  timeout 1800 "$P" bench -m "$1" -p 512 -n 64 -d "$D" -r 1 -t 2 2>&1 | grep -E 'pp512|tg64' | sed 's/^/pagoda /'
}
each_model_round depth_round "$ROUNDS" "$@"
