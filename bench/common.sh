# Sourced by the bench/*.sh comparisons (not run on its own): the pagoda binary
# ($PAGODA, else this tree's release build) and the banner that starts a round,
# with the load average so that a round taken on a busy machine shows.
P="${PAGODA:-$(dirname "${BASH_SOURCE[0]}")/../build/release/src/cli/pagoda}"
# Each engine with its own default thread wait (llama.cpp spins; so does OpenMP
# unless told otherwise), as a user would run them.
unset OMP_WAIT_POLICY
round_banner() { echo "== $* load $(cut -d' ' -f1 /proc/loadavg)"; }
# each_model_round FN ROUNDS MODEL...: for each model, ROUNDS times, the banner
# then `FN MODEL` (the engines compared take turns inside FN, so that a change in
# the machine's load falls on both).
each_model_round() {
  local fn="$1" rounds="$2" m round
  shift 2
  for m in "$@"; do
    for round in $(seq 1 "$rounds"); do
      round_banner "$(basename "$m") round $round"
      "$fn" "$m"
    done
  done
}
