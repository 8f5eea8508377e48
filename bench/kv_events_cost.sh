#!/bin/bash
# The cost of publishing KV events (issue 37): `pagoda serve` with and without
# --kv-events-config (ZeroMQ PUB + replay buffer, no subscriber), each driven by
# `pagoda bench --server` with 32 streams in flight (random 32 x 128 -> 128 at
# concurrency 32), rounds interleaved (order alternating), medians.
# Usage: bench/kv_events_cost.sh ROUNDS [MODEL]
set -u
ROUNDS="$1"; M="${2:-models/SmolLM2-135M-Instruct.Q4_1.gguf}"
. "$(dirname "$0")/common.sh"
PORT=18195; EV=18196; RP=18197
CFG="{\"enable_kv_cache_events\":true,\"publisher\":\"zmq\",\"endpoint\":\"tcp://*:$EV\",\"replay_endpoint\":\"tcp://*:$RP\",\"topic\":\"kv-events\"}"
out=$(mktemp -d)
wait_up() { for _ in $(seq 1 600); do curl -sf "http://127.0.0.1:$1/health" >/dev/null && return 0; sleep 0.2; done; return 1; }
one() {  # one MODE ROUND
  local extra=()
  [ "$1" = on ] && extra=(--kv-events-config "$CFG")
  "$P" serve -m "$M" -t 2 --port $PORT --kv-cache-memory 512MiB "${extra[@]}" >"$out/serve.$1.$2.log" 2>&1 & local SPID=$!
  wait_up $PORT && "$P" bench -m "$M" --server "http://127.0.0.1:$PORT" --workload random --num-prompts 32 \
    --input-len 128 --output-len 128 --max-concurrency 32 --json > "$out/$1.$2.json" 2>/dev/null
  kill $SPID; wait $SPID 2>/dev/null
}
for round in $(seq 1 "$ROUNDS"); do
  round_banner "round $round"
  if [ $((round % 2)) = 1 ]; then one off $round; one on $round; else one on $round; one off $round; fi
done
python3 - "$out" "$ROUNDS" <<'PY'
import json, os, statistics, sys
d, rounds = sys.argv[1], int(sys.argv[2])
v = {m: [json.load(open(os.path.join(d, f"{m}.{r}.json"))) for r in range(1, rounds + 1)] for m in ("off", "on")}
for key in ("output_tokens_per_s", "tpot_ms_p50", "ttft_ms_p50"):
    o = [float(j[key]) for j in v["off"]]; n = [float(j[key]) for j in v["on"]]
    print(f"| {key} | off {', '.join(f'{x:.1f}' for x in o)} | on {', '.join(f'{x:.1f}' for x in n)} | "
          f"median on/off {statistics.median(n) / statistics.median(o):.3f} |")
print("failed requests:", {m: sum(int(j.get("failed", 0)) for j in v[m]) for m in v})
PY
