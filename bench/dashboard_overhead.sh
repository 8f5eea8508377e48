#!/usr/bin/env bash
# The live dashboard's cost to serving throughput (issue 20: under 2% at 10 Hz).
# Many short interleaved rounds of one fixed workload against one `pagoda serve`:
# A = nobody watching, B = a client on /dashboard/events?hz=10 reading every
# event; per round the overhead 1 - B/A of output tokens/s, then the median and
# interquartile range over the rounds (bench/dashboard_overhead.py), printed as
#   dashboard overhead: median X% (IQR a..b) over N rounds
# with the engine-thread time spent on snapshots (the direct cost) on the next line.
#   usage: bench/dashboard_overhead.sh [ROUNDS] [MODEL]
#   environment: THREADS (2), NUM_PROMPTS (16), INPUT_LEN (64), OUTPUT_LEN (32), CONCURRENCY (8), HZ (10)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
ROUNDS="${1:-20}"
MODEL="${2:-$(dirname "${BASH_SOURCE[0]}")/../models/SmolLM2-135M-Instruct.Q4_1.gguf}"
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), load $(cut -d' ' -f1-3 /proc/loadavg)"
exec python3 "$(dirname "${BASH_SOURCE[0]}")/dashboard_overhead.py" "$P" "$MODEL" "$ROUNDS"
