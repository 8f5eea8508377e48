#!/bin/bash
# Decode's weight reads against the machine's sustained read bandwidth at the
# same moment (issue 22, docs/benchmarks-history.md "Session 13"): on these VMs the
# bandwidth the host gives 2 threads swings from second to second, so a probe
# taken minutes (or even one run) away from a decode says little about it.
# Each pair brackets one short decode between two sustained-bandwidth probes:
#   probe  bench_sustained_bandwidth -t T -p 12, the pool line's median GB/s
#          (the same bytes as a decode step, read through the pool);
#   decode pagoda bench --tg 64 -r 2 -t T: weight bytes per token x tok/s;
#   probe  again.
# frac = decode / mean(probes). Printed per pair, then the median per thread
# count: 2-thread decode scales as far as the host's 2-thread bandwidth allows
# when its frac matches the 1-thread one. Every command runs under PRIO
# (default "chrt -f 1"), so that on a shared machine a build waits behind it.
# Usage: bench/decode_vs_sustained.sh MODEL PAIRS [THREADS...]   (default threads: 1 2)
#   MODEL: e.g. `pagoda synth --preset llama-3.2-1b --type q4_0 -o llama1b-q4_0.gguf`
# Env: BW (the bench_sustained_bandwidth binary; default this tree's release build).
set -u
M="$1"; PAIRS="$2"; shift 2
THREADS="${*:-1 2}"
. "$(dirname "$0")/common.sh"
PRIO="${PRIO:-chrt -f 1}"
BW="${BW:-$(dirname "$0")/../build/release/bench/bench_sustained_bandwidth}"
probe() { $PRIO "$BW" -t "$1" -p 12 | awk '/^pool/{print $8}'; }
grep -m1 "model name" /proc/cpuinfo
for t in $THREADS; do
  fracs=()
  for i in $(seq 1 "$PAIRS"); do
    a=$(probe "$t")
    d=$($PRIO "$P" bench -m "$M" --pp 0 --tg 64 -r 2 -t "$t" --no-bandwidth 2>&1 | awk '/^tg:/{print $(NF-1)}')
    b=$(probe "$t")
    f=$(awk -v a="$a" -v b="$b" -v d="$d" 'BEGIN{printf "%.3f", 2 * d / (a + b)}')
    fracs+=("$f")
    echo "t$t pair $i: probe $a, decode $d, probe $b GB/s -> frac $f"
  done
  printf '%s\n' "${fracs[@]}" | sort -n | awk -v t="$t" '{v[NR]=$1} END{m=(NR%2)?v[(NR+1)/2]:(v[NR/2]+v[NR/2+1])/2; printf "t%s median frac %.3f over %d pairs\n", t, m, NR}'
done
