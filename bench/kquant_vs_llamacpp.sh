#!/bin/bash
# Session 9 (issue 22): pagoda vs llama-bench, pp512 + tg128 at 2 threads, in
# ROUNDS interleaved rounds; for Q4_K_M files also pagoda with PAGODA_PACK=0 (the
# unpacked K-quant path). Every command runs alone through the shared lock.
#   usage: bench/kquant_vs_llamacpp.sh OUT_DIR PAGODA LLAMA_BENCH ROUNDS FILE...
# Writes OUT_DIR/<file>.{pagoda,nopack,llama}.<round> (the raw tables).
set -euo pipefail
out=$1 pagoda=$2 llama=$3 rounds=$4
shift 4
mkdir -p "$out"
lock() { flock /tmp/s9/bench.lock timeout 300 chrt -f 1 "$@"; }
for round in $(seq 1 "$rounds"); do
  for f in "$@"; do
    b=$(basename "$f" .gguf)
    lock "$pagoda" bench -m "$f" --pp 512 --tg 128 -r 3 -t 2 > "$out/$b.pagoda.$round" 2>&1
    case $b in *q4_k_m*) PAGODA_PACK=0 lock "$pagoda" bench -m "$f" --pp 512 --tg 128 -r 3 -t 2 > "$out/$b.nopack.$round" 2>&1 ;; esac
    lock "$llama" -m "$f" -p 512 -n 128 -t 2 -r 3 > "$out/$b.llama.$round" 2>&1
  done
done
