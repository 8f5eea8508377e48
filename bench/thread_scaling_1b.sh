#!/bin/bash
# 2-thread decode scaling against the memory wall (issue 22, docs/benchmarks-history.md
# "Session 11: thread scaling"): per round, the machine's sustained read
# bandwidth at 1 and 2 threads (bench_sustained_bandwidth: median of 40 passes
# over a model-sized buffer, plain threads and through the pool), then tg128 at
# 1 and 2 threads from llama.cpp's llama-bench, this pagoda and (optionally) an
# older pagoda binary, each with the host's steal time (/proc/stat, jiffies
# summed over CPUs) during the run. Every run holds LOCK (flock) and runs under
# PRIO, so on a shared machine it runs alone and ahead of builds; each command
# stays well under 2 minutes.
# Usage: bench/thread_scaling_1b.sh LLAMA_BIN_DIR MODEL ROUNDS [OLD_PAGODA]
#   MODEL: e.g. /tmp/s9/llama1b-q4_0.gguf (`pagoda synth --preset llama-3.2-1b --type q4_0`)
# Env: LOCK (default /tmp/s9/bench.lock), PRIO (default "chrt -f 1"), BW (the
# bench_sustained_bandwidth binary; default this tree's release build).
set -u
L="$1/llama-bench"; M="$2"; ROUNDS="$3"; O="${4:-}"
. "$(dirname "$0")/common.sh"
LOCK="${LOCK:-/tmp/s9/bench.lock}"; PRIO="${PRIO:-chrt -f 1}"
BW="${BW:-$(dirname "$0")/../build/release/bench/bench_sustained_bandwidth}"
steal() { awk '/^cpu /{print $9}' /proc/stat; }
locked() { flock "$LOCK" timeout 170 $PRIO "$@"; }
tg() {  # tg WHO BIN THREADS
  local who=$1 bin=$2 t=$3 s0 line
  s0=$(steal)
  if [ "$who" = llama.cpp ]; then
    line=$(locked "$L" -m "$M" -p 0 -n 128 -t "$t" -r 3 -o md 2>/dev/null | grep "tg128")
  else
    line=$(locked "$bin" bench -m "$M" --pp 0 --tg 128 -r 3 -t "$t" --no-bandwidth 2>&1 | grep "^|.*tg128 ")
  fi
  echo "$who t$t $(echo "$line" | awk -F'|' '{print $(NF-1)}') tok/s  steal $(( $(steal) - s0 ))"
}
grep -m1 "model name" /proc/cpuinfo
for r in $(seq 1 "$ROUNDS"); do
  round_banner "round $r"
  locked "$BW" -p 40 | grep -E "^(raw|pool)"
  for t in 1 2; do
    tg llama.cpp - $t
    tg new "$P" $t
    [ -n "$O" ] && tg old "$O" $t
  done
done
