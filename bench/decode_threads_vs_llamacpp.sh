#!/bin/bash
# Single-stream decode at 1 and 2 threads: this pagoda, an older pagoda binary and
# llama.cpp's llama-bench, interleaved rounds; then the same at 2 threads with a
# co-tenant (`yes > /dev/null`) running. What docs/benchmarks.md's "Session 6 lead
# re-measure" ran (there with SMALL = SmolLM2-135M-Instruct Q4_1, BIG = a synth
# Llama-3.2-1B Q4_0 from `pagoda synth --preset llama-3.2-1b --type q4_0`).
# Usage: bench/decode_threads_vs_llamacpp.sh LLAMA_BIN_DIR OLD_PAGODA ROUNDS SMALL BIG
set -u
L="$1/llama-bench"; O="$2"; ROUNDS="$3"; S="$4"; B="$5"
. "$(dirname "$0")/common.sh"
tg() {  # tg WHO BIN MODEL TOKENS THREADS [extra pagoda flags]
  local who=$1 bin=$2 m=$3 n=$4 t=$5; shift 5
  if [ "$who" = llama.cpp ]; then
    "$L" -m "$m" -p 0 -n "$n" -t "$t" -r 3 -o md 2>/dev/null | grep "tg$n" | sed "s/^/$who t$t /"
  else
    "$bin" bench -m "$m" --pp 0 --tg "$n" -r 3 -t "$t" "$@" 2>&1 | grep "tg$n" | sed "s/^/$who t$t /"
  fi
}
lscpu | grep "Model name"
for r in $(seq 1 "$ROUNDS"); do
  round_banner "round $r"
  tg llama.cpp - "$S" 128 2; tg new "$P" "$S" 128 2 --no-bandwidth; tg old "$O" "$S" 128 2
  tg new "$P" "$S" 128 1 --no-bandwidth; tg old "$O" "$S" 128 1
  "$P" bench -m "$S" --pp 512 --tg 0 -r 2 -t 2 --no-bandwidth 2>&1 | grep pp512 | sed 's/^/new t2 /'
  "$O" bench -m "$S" --pp 512 --tg 0 -r 2 -t 2 2>&1 | grep pp512 | sed 's/^/old t2 /'
  tg llama.cpp - "$B" 64 2; tg new "$P" "$B" 64 2 --no-bandwidth
  tg new "$P" "$B" 64 1 --no-bandwidth; tg llama.cpp - "$B" 64 1
done
echo "== bandwidth line"
"$P" bench -m "$B" --pp 0 --tg 64 -r 2 -t 2 2>&1 | grep -E 'tg64|^tg:|^cpu:'
echo "== co-tenant: yes > /dev/null"
yes > /dev/null & YP=$!
trap 'kill $YP 2>/dev/null' EXIT
sleep 1
for r in 1 2; do
  tg new "$P" "$S" 128 2 --no-bandwidth; tg old "$O" "$S" 128 2; tg llama.cpp - "$S" 128 2
done
