#!/bin/bash
# Serving benchmark, pagoda serve vs llama.cpp's llama-server, both measured by
# `pagoda bench --server` with identical token-id prompts. Same model file, 2 threads,
# llama-server with 16 slots and its prompt cache on (the default).
# Usage: bench/serving_vs_llamaserver.sh LLAMA_BIN_DIR MODEL ROUNDS [shared|random|both]
# Extra `pagoda serve` flags: PAGODA_SERVE_ARGS="--max-num-batched-tokens 256 --schedule-policy lpm"
set -u
LS="$1/llama-server"; M="$2"; ROUNDS="$3"; WHICH="${4:-both}"
. "$(dirname "$0")/common.sh"
PORT_L=18181; PORT_P=18182
SHARED="--workload shared-prefix --num-groups 4 --prompts-per-group 16 --prefix-len 1024 --suffix-len 64 --output-len 64 --max-concurrency 16"
RANDOM_W="--workload random --num-prompts 64 --input-len 320 --range-ratio 0.6 --output-len 128 --max-concurrency 16"
wait_up() { for _ in $(seq 1 600); do curl -sf "http://127.0.0.1:$1/health" >/dev/null && return 0; sleep 0.2; done; return 1; }
run_client() {  # name port workload...
  local name="$1" port="$2"; shift 2
  "$P" bench -m "$M" --server "http://127.0.0.1:$port" "$@" --json 2>/dev/null | python3 -c "
import json,sys; j=json.load(sys.stdin)
print('$name', ' '.join('%s=%s' % (k, j.get(k)) for k in ['completed','failed','duration_s','request_throughput','output_tokens_per_s','ttft_ms_mean','ttft_ms_p50','tpot_ms_p50','prefix_hit_rate']))"
}
for round in $(seq 1 "$ROUNDS"); do
  for w in shared random; do
    [ "$WHICH" = both ] || [ "$WHICH" = "$w" ] || continue
    if [ $w = shared ]; then W=$SHARED; else W=$RANDOM_W; fi
    round_banner "$w round $round"
    "$LS" -m "$M" -t 2 -np 16 -c 20480 --port $PORT_L >/tmp/llama-server.log 2>&1 & LPID=$!
    wait_up $PORT_L && run_client llama-server $PORT_L $W
    kill $LPID; wait $LPID 2>/dev/null
    "$P" serve -m "$M" -t 2 --port $PORT_P --kv-cache-memory 512MiB ${PAGODA_SERVE_ARGS:-} >/tmp/pagoda-serve.log 2>&1 & PPID_=$!
    wait_up $PORT_P && run_client pagoda $PORT_P $W
    kill $PPID_; wait $PPID_ 2>/dev/null
  done
done
