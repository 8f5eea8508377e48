#!/bin/bash
# Session 8 (issue 22, decode-packed weights): tg and pp512 at 2 threads for this
# pagoda, an older pagoda binary (the commit before the change) and llama.cpp's
# llama-bench, interleaved per round (llama.cpp, new, old), then the bandwidth
# line of the last model. TG (default 128) decoded tokens, -r 2 for tg, -r 1 for pp.
# Usage: bench/packed_decode_vs_llamacpp.sh LLAMA_BIN_DIR OLD_PAGODA ROUNDS MODEL...
# LLAMA_BIN_DIR "-" leaves llama.cpp out (its spinning threads collapse on a
# machine shared with other busy processes: 0.55 tok/s tg128 at load 18).
set -u
L="$1/llama-bench"; O="$2"; ROUNDS="$3"; shift 3
TG="${TG:-128}"
. "$(dirname "$0")/common.sh"
one() {  # one MODEL: the three engines, tg then pp512
  local m="$1"
  [ "$L" = "-/llama-bench" ] || "$L" -m "$m" -p 512 -n "$TG" -t 2 -r 2 -o md 2>/dev/null | grep -E "pp512|tg$TG" | sed 's/^/llama.cpp /'
  "$P" bench -m "$m" --pp 512 --tg "$TG" -r 2 -t 2 --no-bandwidth 2>&1 | grep -E "pp512|tg$TG" | sed 's/^/new /'
  "$O" bench -m "$m" --pp 512 --tg "$TG" -r 2 -t 2 --no-bandwidth 2>&1 | grep -E "pp512|tg$TG" | sed 's/^/old /'
}
lscpu | grep "Model name"
each_model_round one "$ROUNDS" "$@"
echo "== bandwidth line (new)"
"$P" bench -m "${!#}" --pp 0 --tg "$TG" -r 2 -t 2 2>&1 | grep -E "tg$TG|^tg:|^cpu:"
