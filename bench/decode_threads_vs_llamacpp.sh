#!/bin/bash
# Single-stream decode at 1 and 2 threads: this pagoda, an older pagoda binary and
# llama.cpp's llama-bench, interleaved rounds; then the same with a co-tenant
# (`yes > /dev/null`) running, against the same runs without it in the same round.
# What docs/benchmarks-history.md's "Session 6 lead re-measure" and "Session 8: thread
# scaling" ran (SMALL = SmolLM2-135M-Instruct Q4_1, BIG = a synth Llama-3.2-1B Q4_0
# from `pagoda synth --preset llama-3.2-1b --type q4_0`).
# Usage: bench/decode_threads_vs_llamacpp.sh LLAMA_BIN_DIR OLD_PAGODA ROUNDS SMALL BIG
# Env: PRIO, a command prefix for the runs without co-tenant (e.g. "chrt -f 1" to
# put them ahead of other users' work on a shared machine; session 8 did); the
# co-tenant section always runs under the default scheduler, where `yes` and the
# engine share the cores as a user's would. CO_ROUNDS (default 3): its rounds.
# On a machine shared with other users' work (autogroups on), session 8 ran it as
#   setsid bash -c 'echo -20 > /proc/self/autogroup; exec bench/decode_threads_vs_llamacpp.sh ...'
# so that this session's processes (the engines and `yes`, all nice 0 among
# themselves) got most of the cores; a run that exceeds 180 s is cut (timeout).
set -u
L="$1/llama-bench"; O="$2"; ROUNDS="$3"; S="$4"; B="$5"
PRIO="${PRIO:-}"; CO_ROUNDS="${CO_ROUNDS:-3}"
. "$(dirname "$0")/common.sh"
tg() {  # tg PREFIX WHO BIN MODEL TOKENS THREADS REPS [extra pagoda flags]
  local pre=$1 who=$2 bin=$3 m=$4 n=$5 t=$6 r=$7; shift 7
  if [ "$who" = llama.cpp ]; then
    timeout 180 $pre "$L" -m "$m" -p 0 -n "$n" -t "$t" -r "$r" -o md 2>/dev/null | grep "tg$n" | sed "s/^/$who t$t /"
  else
    timeout 180 $pre "$bin" bench -m "$m" --pp 0 --tg "$n" -r "$r" -t "$t" --no-bandwidth "$@" 2>&1 | grep "tg$n " |
      sed "s/^/$who t$t /"
  fi
}
lscpu | grep "Model name"
echo "PRIO='$PRIO'"
for r in $(seq 1 "$ROUNDS"); do
  round_banner "round $r"
  for t in 2 1; do
    tg "$PRIO" llama.cpp - "$S" 128 $t 3; tg "$PRIO" new "$P" "$S" 128 $t 3; tg "$PRIO" old "$O" "$S" 128 $t 3
  done
  for t in 2 1; do
    tg "$PRIO" llama.cpp - "$B" 64 $t 2; tg "$PRIO" new "$P" "$B" 64 $t 2; tg "$PRIO" old "$O" "$B" 64 $t 2
  done
done
echo "== bandwidth line"
for t in 1 2; do $PRIO "$P" bench -m "$B" --pp 0 --tg 64 -r 2 -t $t 2>&1 | grep -E '^tg:'; done
# Co-tenant: per round, each run once without and once with `yes` running.
YP=
trap '[ -n "$YP" ] && kill $YP 2>/dev/null' EXIT
cotenant_runs() {  # the runs of one half-round
  for t in 2 1; do
    tg "" llama.cpp - "$S" 64 $t 2; tg "" new "$P" "$S" 64 $t 2; tg "" old "$O" "$S" 64 $t 2
  done
  tg "" llama.cpp - "$B" 16 2 1; tg "" new "$P" "$B" 16 2 1; tg "" old "$O" "$B" 16 2 1
}
for r in $(seq 1 "$CO_ROUNDS"); do
  round_banner "co-tenant round $r: alone"
  cotenant_runs
  yes > /dev/null & YP=$!
  sleep 0.5
  round_banner "co-tenant round $r: with yes"
  cotenant_runs
  kill $YP; wait $YP 2>/dev/null; YP=
done
