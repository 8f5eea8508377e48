#!/usr/bin/env bash
# bench/kv_quant_vs_ggml.sh LLAMA_CPP_DIR [BUILD_DIR]: builds bench/external/kv_quant_vs_ggml.cc
# against pagoda's base and kernels libraries and llama.cpp's libggml-base, runs it.
# (In bench/external/: bench/CMakeLists.txt builds every bench/*.cc, and this one needs ggml.h.)
# LLAMA_CPP_DIR: a llama.cpp source tree with its build in LLAMA_CPP_DIR/build (bin/libggml-base.so).
set -euo pipefail
L=${1:?LLAMA_CPP_DIR}; B=${2:-build/release}
out=$(mktemp -d)/kv_quant_vs_ggml
g++ -std=c++20 -O2 -Isrc -I"$L/ggml/include" bench/external/kv_quant_vs_ggml.cc \
  "$B/src/kernels/libpagoda_kernels.a" "$B/src/base/libpagoda_base.a" \
  -L"$L/build/bin" -lggml-base -Wl,-rpath,"$L/build/bin" -lpthread -o "$out"
"$out"
