#!/bin/bash
# IQ4_NL weights (issue 14): pagoda's integer kernel (q8_0 activations, codebook by byte
# shuffle) against llama-bench on the same file, and against pagoda's dequantize-to-f32
# fallback (PAGODA_KQUANT_FALLBACK=1), interleaved rounds; each engine -r 1 per round
# (take the median over rounds). The fallback decodes ~10x slower, so it runs tg16.
# Usage: bench/iq4nl_vs_llamacpp.sh LLAMA_BIN_DIR ROUNDS THREADS MODEL...
# A file: build/release/src/cli/pagoda synth --preset smollm2-360m --type iq4_nl -o /tmp/x.gguf
# (IQ4_NL layers, Q8_0 tied embedding/output, as llama.cpp quantizes IQ4_NL files).
set -u
L="$1/llama-bench"; ROUNDS="$2"; T="$3"; shift 3
. "$(dirname "$0")/common.sh"
one_round() {
  timeout 900 "$L" -m "$1" -p 512 -n 128 -t "$T" -r 1 -o md 2>/dev/null | grep -E 'pp512|tg128' | sed 's/^/llama.cpp /'
  timeout 900 "$P" bench -m "$1" --pp 512 --tg 128 -r 1 -t "$T" 2>&1 | grep -E 'pp512|tg128' | sed 's/^/pagoda /'
  PAGODA_KQUANT_FALLBACK=1 timeout 900 "$P" bench -m "$1" --pp 512 --tg 16 -r 1 -t "$T" 2>&1 |
    grep -E 'pp512|tg16' | sed 's/^/pagoda-f32-fallback /'
}
each_model_round one_round "$ROUNDS" "$@"
