#!/bin/bash
# Batched decode against llama-batched-bench: B streams x (128 prompt + 128 output), 2 threads,
# interleaved rounds. Usage: bench/batched_vs_llamacpp.sh LLAMA_BIN_DIR ROUNDS MODEL...
set -u
L="$1/llama-batched-bench"; ROUNDS="$2"; shift 2
. "$(dirname "$0")/common.sh"
one_round() {  # MODEL
  timeout 900 "$L" -m "$1" -c 10240 -b 2048 -ub 512 -npp 128 -ntg 128 -npl 8,32 -t 2 2>/dev/null \
    | grep -E '^\|\s+128' | sed 's/^/llama.cpp /'
  for B in 8 32; do
    timeout 900 "$P" bench -m "$1" --workload random --input-len 128 --output-len 128 --range-ratio 0 \
      --num-prompts $B --max-concurrency $B -t 2 --kv-cache-memory 512MiB --json 2>/dev/null \
      | python3 -c "import json,sys; j=json.load(sys.stdin); print('pagoda B=$B steady_decode_tok_s=%.1f duration_s=%.2f' % (j.get('steady_decode_tokens_per_s', float('nan')), j['duration_s']))"
  done
}
each_model_round one_round "$ROUNDS" "$@"
