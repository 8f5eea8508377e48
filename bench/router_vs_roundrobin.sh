#!/bin/bash
# `pagoda router` with prefix affinity vs round-robin (issue 16): two `pagoda serve`
# replicas with -t 1 each behind the router, the shared-prefix workload (8 groups x
# 16 requests, a 1,024-token prefix each, all sent at once) by `pagoda bench --server`
# through the router. Per run: request throughput, and the prefix hit rate from the
# replicas' own /metrics (sum of prefix_cache_hits_total / sum of queries_total).
# Every run starts fresh replicas (cold caches); the two policies take turns in each
# round with the same seed. Ends with the median of each column per policy.
# Usage: bench/router_vs_roundrobin.sh [ROUNDS=3] [MODEL]
# Extra `pagoda serve` flags: PAGODA_SERVE_ARGS="--kv-cache-memory 512MiB"
set -u
ROUNDS="${1:-3}"
. "$(dirname "$0")/common.sh"
M="${2:-$(dirname "$0")/../models/SmolLM2-135M-Instruct.Q4_1.gguf}"
PORT_A=18191; PORT_B=18192; PORT_R=18190
W="--workload shared-prefix --num-groups 8 --prompts-per-group 16 --prefix-len 1024 --suffix-len 32 --output-len 32"
OUT=$(mktemp); trap 'rm -f "$OUT"' EXIT
wait_up() { for _ in $(seq 1 600); do curl -sf "http://127.0.0.1:$1/health" >/dev/null && return 0; sleep 0.1; done; return 1; }
hits_queries() {  # port -> "hits queries"
  curl -sf "http://127.0.0.1:$1/metrics" | awk '
    /^#/ {next} $1 ~ /prefix_cache_hits_total({.*})?$/ {h += $2} $1 ~ /prefix_cache_queries_total({.*})?$/ {q += $2}
    END {printf "%d %d\n", h, q}'
}
one_run() {  # policy seed
  local policy="$1" seed="$2" pids=()
  for port in $PORT_A $PORT_B; do
    "$P" serve -m "$M" -t 1 --port $port ${PAGODA_SERVE_ARGS:-} >/tmp/router-bench-$port.log 2>&1 & pids+=($!)
  done
  wait_up $PORT_A && wait_up $PORT_B || { echo "a replica did not start"; exit 1; }
  "$P" router -m "$M" --policy "$policy" --replica http://127.0.0.1:$PORT_A --replica http://127.0.0.1:$PORT_B \
      --port $PORT_R >/tmp/router-bench-router.log 2>&1 & pids+=($!)
  wait_up $PORT_R || { echo "the router did not start"; exit 1; }
  local j
  j=$("$P" bench -m "$M" --server "http://127.0.0.1:$PORT_R" $W --seed "$seed" --json 2>/dev/null)
  local ha qa hb qb
  read -r ha qa < <(hits_queries $PORT_A)
  read -r hb qb < <(hits_queries $PORT_B)
  local decisions
  decisions=$(curl -sf "http://127.0.0.1:$PORT_R/metrics" | awk -F'[{}" ]+' '
    /^pagoda:router_routing_decisions_total/ && $NF > 0 {printf "%s%s=%d", sep, $3, $NF; sep=","}')
  echo "$j" | python3 -c "
import json, sys
j = json.load(sys.stdin)
ha, qa, hb, qb = $ha, $qa, $hb, $qb
print('$policy', 'req_per_s=%.3f' % j['request_throughput'], 'replica_hit_rate=%.4f' % ((ha + hb) / max(1, qa + qb)),
      'completed=%d' % j['completed'], 'failed=%d' % j['failed'], 'duration_s=%.2f' % j['duration_s'],
      'ttft_ms_p50=%.0f' % j['ttft_ms_p50'], 'prefill_tokens_a=%d' % (qa - ha), 'prefill_tokens_b=%d' % (qb - hb),
      'decisions=$decisions')" | tee -a "$OUT"
  kill "${pids[@]}"; wait "${pids[@]}" 2>/dev/null
}
for round in $(seq 1 "$ROUNDS"); do
  round_banner "router round $round"
  # Alternate which policy goes first, so a change in the machine's load falls on both.
  if [ $((round % 2)) = 1 ]; then order="prefix round-robin"; else order="round-robin prefix"; fi
  for policy in $order; do one_run "$policy" "$round"; done
done
echo "== medians of $ROUNDS rounds"
python3 - "$OUT" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    f = line.split()
    rows.setdefault(f[0], []).append({k: float(v) for k, v in (x.split("=") for x in f[1:6])})
for policy, rs in rows.items():
    med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
    print(policy, " ".join("%s=%g" % kv for kv in med.items()))
PY
