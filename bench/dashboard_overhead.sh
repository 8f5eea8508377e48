#!/usr/bin/env bash
# The live dashboard's cost to serving throughput (issue 20: under 2% at 10 Hz).
# One `pagoda serve`; each round runs the same `pagoda bench --server` workload
# twice, once with nobody watching and once with a client on
# /dashboard/events?hz=10 reading every event (the order alternates between
# rounds), and prints output tokens/s of both; medians at the end. The client
# also reports the engine-thread time of each snapshot (snapshot_us).
#   usage: bench/dashboard_overhead.sh [ROUNDS] [MODEL]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
ROUNDS="${1:-5}"
MODEL="${2:-$(dirname "${BASH_SOURCE[0]}")/../models/SmolLM2-135M-Instruct.Q4_1.gguf}"
PORT="${PORT:-18977}"
THREADS="${THREADS:-2}"
WORK=(--workload random --num-prompts "${NUM_PROMPTS:-48}" --input-len 128 --output-len 64 --max-concurrency 16 --json)
TMP="$(mktemp -d)"
"$P" serve -m "$MODEL" --port "$PORT" -t "$THREADS" >"$TMP/serve.log" 2>&1 &
SERVE=$!
trap 'kill $SERVE 2>/dev/null; wait $SERVE 2>/dev/null; rm -rf "$TMP"' EXIT
for _ in $(seq 100); do grep -q "listening on" "$TMP/serve.log" && break; sleep 0.2; done
URL="http://127.0.0.1:$PORT"
"$P" bench -m "$MODEL" --server "$URL" "${WORK[@]}" >/dev/null  # warm-up

# A dashboard client: reads every event until killed; writes the events count
# and the medians of snapshot_us (engine thread) and encode_us (the hub's
# thread) to $1 on exit.
watch() {
  python3 - "$URL/dashboard/events?hz=10" "$1" <<'PY' &
import json, signal, statistics, sys, urllib.request
us, enc, n = [], [], 0
def done(*_):
    with open(sys.argv[2], "w") as f:
        f.write("%d %.0f %.0f\n" % (n, statistics.median(us) if us else -1, statistics.median(enc) if enc else -1))
    sys.exit(0)
signal.signal(signal.SIGTERM, done)
with urllib.request.urlopen(sys.argv[1]) as r:
    for line in r:
        if line.startswith(b"data: "):
            n += 1
            ev = json.loads(line[6:])
            us.append(ev.get("snapshot_us", -1))
            enc.append(ev.get("encode_us", -1))
PY
  WATCHER=$!
}
# The server's CPU time (user + system, in clock ticks) so far.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$SERVE/stat"; }
run() {  # run none|dash -> "output_tokens/s server_cpu_ms_per_output_token"
  local mode="$1" out c0 c1
  if [ "$mode" = dash ]; then watch "$TMP/watch.txt"; sleep 0.5; fi
  c0=$(cpu_ticks)
  out=$("$P" bench -m "$MODEL" --server "$URL" "${WORK[@]}")
  c1=$(cpu_ticks)
  if [ "$mode" = dash ]; then kill "$WATCHER"; wait "$WATCHER" 2>/dev/null || true; fi
  echo "$out" | python3 -c "
import json, os, sys
j = json.load(sys.stdin)
tps = j.get('output_throughput', j.get('output_tokens_per_s'))
ms = ($c1 - $c0) * 1000.0 / os.sysconf('SC_CLK_TCK') / j['total_output_tokens']
print('%.2f %.3f' % (tps, ms))"
}
none=() dash=()
for r in $(seq 1 "$ROUNDS"); do
  round_banner "round $r"
  if [ $((r % 2)) = 1 ]; then a=$(run none); b=$(run dash); else b=$(run dash); a=$(run none); fi
  none+=("$a"); dash+=("$b")
  echo "none: $a   dashboard@10Hz: $b   (tok/s, server CPU ms per output token; events, median snapshot_us, encode_us: $(cat "$TMP/watch.txt"))"
done
python3 - "${none[*]}" "${dash[*]}" <<'PY'
import statistics, sys
def cols(s):
    v = [float(x) for x in s.split()]
    return v[0::2], v[1::2]
(ta, ca), (tb, cb) = cols(sys.argv[1]), cols(sys.argv[2])
med = statistics.median
print("throughput: median none %.2f tok/s, dashboard %.2f tok/s: %+.2f%% (median of per-round ratios %+.2f%%)"
      % (med(ta), med(tb), 100 * (med(tb) / med(ta) - 1), 100 * (med([y / x for x, y in zip(ta, tb)]) - 1)))
print("server CPU per output token: median none %.3f ms, dashboard %.3f ms: %+.2f%% (median of per-round ratios %+.2f%%)"
      % (med(ca), med(cb), 100 * (med(cb) / med(ca) - 1), 100 * (med([y / x for x, y in zip(ca, cb)]) - 1)))
PY
