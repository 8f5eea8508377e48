#!/bin/bash
# Perplexity per KV cache type (issue 39): `pagoda perplexity` against llama-perplexity on
# the same file, text and chunks, for f16, q8_0/q4_0, q4_0 and iq4_nl K/V. llama.cpp gets
# -fa on (it needs flash attention for a quantized V cache). Each line: engine, model,
# K/V, the final estimate. Quality, not speed: -b only sets how many chunks run at once.
# Usage: bench/ppl_vs_llamacpp.sh LLAMA_BIN_DIR|- TEXT CTX CHUNKS THREADS MODEL...
#   LLAMA_BIN_DIR "-": pagoda only. ENGINES="pagoda" or "llama" runs one side.
# TEXT: scripts/setup's models/kjv-genesis-deuteronomy.txt (about 200k tokens).
set -u
LDIR="$1"; TEXT="$2"; CTX="$3"; CHUNKS="$4"; T="$5"; shift 5
. "$(dirname "$0")/common.sh"
ENGINES="${ENGINES:-pagoda llama}"
[ "$LDIR" = - ] && ENGINES=pagoda
KV_PAIRS="${KV_PAIRS:-f16/f16 q8_0/q4_0 q4_0/q4_0 iq4_nl/iq4_nl}"  # or as the environment sets
for m in "$@"; do
  for kv in $KV_PAIRS; do
    k="${kv%/*}"; v="${kv#*/}"
    for e in $ENGINES; do
      if [ "$e" = pagoda ]; then
        # Every chunk at once (-b CHUNKS x CTX): one decode step scores a token of each.
        out=$(timeout 1800 "$P" perplexity -m "$m" -f "$TEXT" -c "$CTX" --chunks "$CHUNKS" -t "$T" \
              -b $((CHUNKS * CTX)) --kv-cache-memory 2GiB -ctk "$k" -ctv "$v" 2>&1)
      else
        out=$(timeout 1800 "$LDIR/llama-perplexity" -m "$m" -f "$TEXT" -c "$CTX" --chunks "$CHUNKS" -t "$T" \
              -b 2048 -fa on -ctk "$k" -ctv "$v" 2>&1)
      fi
      echo "$e $(basename "$m") $kv load $(cut -d' ' -f1 /proc/loadavg): $(echo "$out" | grep -o 'Final estimate.*' || echo "$out" | tail -3)"
    done
  done
done
