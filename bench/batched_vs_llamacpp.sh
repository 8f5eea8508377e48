#!/bin/bash
# Batched decode against llama-batched-bench: B streams x (128 prompt + 128 output), 2 threads,
# interleaved rounds. Usage: bench/batched_vs_llamacpp.sh LLAMA_BIN_DIR ROUNDS MODEL...
set -u
L="$1/llama-batched-bench"; ROUNDS="$2"; shift 2
P="${PAGODA:-$(dirname "$0")/../build/release/src/cli/pagoda}"
unset OMP_WAIT_POLICY
for M in "$@"; do
  for round in $(seq 1 "$ROUNDS"); do
    echo "== $(basename "$M") round $round load $(cut -d' ' -f1 /proc/loadavg)"
    timeout 900 "$L" -m "$M" -c 10240 -b 2048 -ub 512 -npp 128 -ntg 128 -npl 8,32 -t 2 2>/dev/null \
      | grep -E '^\|\s+128' | sed 's/^/llama.cpp /'
    for B in 8 32; do
      timeout 900 "$P" bench -m "$M" --workload random --input-len 128 --output-len 128 --range-ratio 0 \
        --num-prompts $B --max-concurrency $B -t 2 --kv-cache-memory 512MiB --json 2>/dev/null \
        | python3 -c "import json,sys; j=json.load(sys.stdin); print('pagoda B=$B steady_decode_tok_s=%.1f duration_s=%.2f' % (j.get('steady_decode_tokens_per_s', float('nan')), j['duration_s']))"
    done
  done
done
