#!/bin/bash
# Two pagoda binaries side by side (a change against the commit before it):
# single-stream pp512 / tg128 (`pagoda bench`) and 32-stream decode (the random
# serving workload, 32 x 128 -> 128, all in flight), and HTTP serving (`OLD serve` /
# `NEW serve`, each driven by NEW's `bench --server`: random 64 x 320 +-60% -> 128 at
# concurrency 16, as bench/serving_vs_llamaserver.sh), interleaved rounds, medians.
# Usage: bench/old_vs_new.sh OLD_PAGODA NEW_PAGODA ROUNDS [MODEL]
# Build OLD from a clean worktree of the base commit, e.g.
#   git worktree add /tmp/old-src BASE && cmake -S /tmp/old-src -B /tmp/old-build -G Ninja && ninja -C /tmp/old-build pagoda
set -u
OLD="$1"; NEW="$2"; ROUNDS="$3"; M="${4:-models/SmolLM2-135M-Instruct.Q4_1.gguf}"
. "$(dirname "$0")/common.sh"
out=$(mktemp -d)
PORT=18190
wait_up() { for _ in $(seq 1 600); do curl -sf "http://127.0.0.1:$1/health" >/dev/null && return 0; sleep 0.2; done; return 1; }
for round in $(seq 1 "$ROUNDS"); do
  for who in old new; do
    if [ $who = old ]; then P="$OLD"; else P="$NEW"; fi
    round_banner "round $round $who" >&2
    "$P" bench -m "$M" --pp 512 --tg 128 -r 3 -t 2 --json > "$out/single.$who.$round.json"
    "$P" bench -m "$M" --workload random --num-prompts 32 --input-len 128 --output-len 128 \
      --max-concurrency 32 -t 2 --json > "$out/batch.$who.$round.json"
    "$P" serve -m "$M" -t 2 --port $PORT --kv-cache-memory 512MiB >"$out/serve.$who.$round.log" 2>&1 & SPID=$!
    wait_up $PORT && "$NEW" bench -m "$M" --server "http://127.0.0.1:$PORT" --workload random --num-prompts 64 \
      --input-len 320 --range-ratio 0.6 --output-len 128 --max-concurrency 16 --json > "$out/serve.$who.$round.json" 2>/dev/null
    kill $SPID; wait $SPID 2>/dev/null
  done
done
python3 - "$out" "$ROUNDS" <<'PY'
import json, sys, statistics, glob, os
d, rounds = sys.argv[1], int(sys.argv[2])
def load(kind, who, r):
    return json.load(open(os.path.join(d, f"{kind}.{who}.{r}.json")))
def find(j, *names):
    return float(j[names[0]])
rows = []
for label, kind, paths in [
    ("pp512 tok/s", "single", ("pp_tokens_per_s",)),
    ("tg128 tok/s", "single", ("tg_tokens_per_s",)),
    ("32-stream output tok/s", "batch", ("output_tokens_per_s",)),
    ("HTTP serving output tok/s", "serve", ("output_tokens_per_s",)),
    ("HTTP serving TTFT p50 ms", "serve", ("ttft_ms_p50",)),
]:
    vals = {w: [find(load(kind, w, r), *paths) for r in range(1, rounds + 1)] for w in ("old", "new")}
    mo, mn = statistics.median(vals["old"]), statistics.median(vals["new"])
    rows.append((label, vals["old"], vals["new"], mo, mn, mn / mo))
print("| metric | old (rounds) | new (rounds) | old median | new median | new/old |")
print("|---|---|---|---|---|---|")
for label, o, n, mo, mn, r in rows:
    f = lambda v: ", ".join(f"{x:.1f}" for x in v)
    print(f"| {label} | {f(o)} | {f(n)} | {mo:.1f} | {mn:.1f} | {r:.3f} |")
for who in ("old", "new"):
    failed = sum(int(load("serve", who, r).get("failed", 0)) for r in range(1, rounds + 1))
    print(f"HTTP serving, {who}: {failed} failed requests")
# A faster run that changed the answer is no win: the greedy tg tokens and the
# 32-stream outputs must hash the same in every run of both binaries.
for kind, key in (("single", "tg_tokens_hash"), ("batch", "output_hash")):
    if not all(key in load(kind, w, r) for w in ("old", "new") for r in range(1, rounds + 1)):
        print(f"{key}: not reported by one of the binaries"); continue
    hashes = {load(kind, w, r)[key] for w in ("old", "new") for r in range(1, rounds + 1)}
    print(f"{key}: {'same in every run' if len(hashes) == 1 else 'DIFFERENT: ' + ', '.join(sorted(hashes))}")
PY
