#!/usr/bin/env bash
# Speculative decoding (prompt lookup) against plain decoding, single stream,
# offline through `pagoda bench`: the copy workload ("repeat this code with one
# change", outputs copy their prompts) and the random workload, ROUNDS rounds
# with the two configurations taking turns, then the medians and the median of
# the per-round speedups. Outputs must hash the same (greedy). WORKLOADS (env)
# picks them: "copy random" by default; copy-long is copy over a 16-entry dict
# (answers of about 110 tokens, bench_copy_workload.h).
# usage: [WORKLOADS="copy copy-long random"] bench/spec_decode_vs_plain.sh [ROUNDS=3] [MODEL] [THREADS=2] [SPEC_JSON]
set -euo pipefail
source "$(dirname "$0")/common.sh"
ROUNDS="${1:-3}"
MODEL="${2:-$(dirname "$0")/../models/SmolLM2-135M-Instruct.Q4_1.gguf}"
THREADS="${3:-2}"
WORKLOADS="${WORKLOADS:-copy random}"
SPEC="${4:-{\"method\":\"ngram\",\"num_speculative_tokens\":8,\"prompt_lookup_max\":4,\"prompt_lookup_min\":2\}}"
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
run() {  # workload config
  local wl="$1" cfg="$2" args=()
  [ "$wl" = copy ] && args=(--workload copy --num-prompts 8 --output-len 256)
  [ "$wl" = copy-long ] && args=(--workload copy-long --num-prompts 8 --output-len 256)
  [ "$wl" = random ] && args=(--workload random --num-prompts 4 --input-len 128 --output-len 128)
  [ "$cfg" = spec ] && args+=(--speculative-config "$SPEC")
  "$P" bench -m "$MODEL" -t "$THREADS" --max-concurrency 1 --json "${args[@]}" 2>/dev/null |
    python3 -c "import json,sys; d=json.load(sys.stdin); print('$wl $cfg %.3f %s %d' % (d['output_tokens_per_s'], d['output_hash'], d['total_output_tokens']))" | tee -a "$OUT"
}
for round in $(seq 1 "$ROUNDS"); do
  round_banner "round $round"
  for wl in $WORKLOADS; do
    if [ $((round % 2)) = 1 ]; then run "$wl" plain; run "$wl" spec; else run "$wl" spec; run "$wl" plain; fi
  done
done
python3 - "$OUT" $WORKLOADS <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
print("| workload | plain tok/s | spec tok/s | speedup | output hash equal |")
print("|---|---|---|---|---|")
for wl in sys.argv[2:]:
    p = [float(r[2]) for r in rows if r[0] == wl and r[1] == "plain"]
    s = [float(r[2]) for r in rows if r[0] == wl and r[1] == "spec"]
    hashes = {r[3] for r in rows if r[0] == wl}
    print(f"| {wl} | {statistics.median(p):.1f} | {statistics.median(s):.1f} | "
          f"{statistics.median(b / a for a, b in zip(p, s)):.2f}x | {len(hashes) == 1} |")
PY
