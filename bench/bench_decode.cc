// Decode micro-benchmark: GB/s of weights read by single-token matmuls (the
// decode path) per quant type, at 1 and 2 threads (or the -t list), for the
// matrices of one Llama-3.2-1B-shaped layer (q 2048x2048, k/v 512x2048, o
// 2048x2048, gate/up 8192x2048, down 2048x8192). Several layer copies are
// cycled (>= 256 MiB) so that every call streams from DRAM, as a real decode
// does. One line per type; a kernel regression shows without a model.
//   usage: bench_decode [-t 1,2] [-r REPS] [-n TOKENS] [--cpu-time] [TYPE...]   (types: q4_0 q8_0 q4_k ...)
// --cpu-time divides by the process's CPU seconds instead of wall seconds: on a
// machine shared with other busy processes it shows the kernel's own speed
// (GB per CPU-second; at 1 thread, per core), not the scheduler's share.
// -n TOKENS (default 1) runs the batched path instead (GB/s is then weight bytes
// over the time of a TOKENS-token matmul: only for comparing lines of one run).
// Prints the median over REPS passes (each pass = every matrix of every copy
// once) of weight bytes / wall time. Types the CPU backend packs at load (on
// AVX-512: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K and IQ4_XS) get a second
// line, "pk", through the packed copy; its hash must equal the unpacked line's
// (packed weights give bitwise the same outputs).
#include <algorithm>
#include <cinttypes>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <strings.h>
#include <string>
#include <vector>

#include "base/aligned.h"
#include "base/fp16.h"
#include "base/ggml_types.h"
#include "base/rng.h"
#include "base/timer.h"
#include "kernels/api.h"
#include "kernels/backend.h"

namespace pagoda::kernels {
namespace {

struct Shape {
  int64_t rows, cols;
};
// One Llama-3.2-1B layer: q, k, v, o, gate, up, down.
const Shape kLayer[] = {{2048, 2048}, {512, 2048}, {512, 2048}, {2048, 2048},
                        {8192, 2048}, {8192, 2048}, {2048, 8192}};

const GgmlType kDefaultTypes[] = {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0,
                                  GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K,
                                  GgmlType::IQ4_NL, GgmlType::IQ4_XS, GgmlType::F16, GgmlType::BF16};

void put_f16(uint8_t* p, float v) {
  const uint16_t h = fp32_to_fp16(v);
  std::memcpy(p, &h, 2);
}

// Random quants with small, finite scales (the kernels' speed does not depend
// on the values; NaN/Inf scales would only make the hash meaningless).
void fill_blocks(GgmlType t, uint8_t* p, size_t bytes, Rng& rng) {
  for (size_t i = 0; i + 8 <= bytes; i += 8) {
    const uint64_t v = rng.next_u64();
    std::memcpy(p + i, &v, 8);
  }
  const GgmlTypeInfo& info = ggml_type_info(t);
  for (size_t b = 0; b + info.type_size <= bytes; b += info.type_size) {
    uint8_t* blk = p + b;
    switch (t) {
      case GgmlType::F16:
      case GgmlType::BF16: break;  // random halves: fine for timing, NaNs possible (hash only)
      case GgmlType::Q2_K: put_f16(blk + 80, 0.01f); put_f16(blk + 82, 0.01f); break;
      case GgmlType::Q3_K: put_f16(blk + 108, 0.01f); break;
      case GgmlType::Q6_K: put_f16(blk + 208, 0.001f); break;
      case GgmlType::Q4_1: case GgmlType::Q5_1: case GgmlType::Q4_K: case GgmlType::Q5_K:
        put_f16(blk, 0.001f);
        put_f16(blk + 2, 0.001f);
        break;
      default: put_f16(blk, 0.01f); break;  // Q4_0, Q5_0, Q8_0, IQ4_NL, IQ4_XS: d first
    }
  }
}

GgmlType parse_type(const char* s) {
  for (uint32_t id = 0; id < 64; ++id) {
    const GgmlTypeInfo* info = ggml_type_info(id);
    if (info == nullptr || !info->supported) continue;
    std::string n = info->name;
    if (strcasecmp(n.c_str(), s) == 0) return static_cast<GgmlType>(id);
  }
  std::fprintf(stderr, "bench_decode: unknown type '%s'\n", s);
  std::exit(2);
}

std::vector<int> g_threads;
int g_reps = 7;
bool g_cpu_time = false;  // --cpu-time: divide by the process's CPU seconds, not wall seconds
int64_t g_tokens = 1;     // -n: tokens per matmul (1 = decode; larger: the batched path, for pk vs rows)

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Prints the median GB/s per thread count and a hash of the outputs.
void measure(const std::vector<WeightView>& views, size_t layer_bytes, int copies) {
  Rng rng(7);
  std::vector<float> x(static_cast<size_t>(8192 * g_tokens)), y(static_cast<size_t>(8192 * g_tokens));
  for (auto& v : x) v = static_cast<float>(rng.normal());
  uint32_t hash = 0;
  bool same = true;  // every thread count gave the same outputs
  for (size_t ti = 0; ti < g_threads.size(); ++ti) {
    set_num_threads(g_threads[ti]);
    std::vector<double> gbs;
    for (int r = -1; r < g_reps; ++r) {  // r == -1: warm-up
      Timer timer;
      const double c0 = process_cpu_seconds();
      for (const WeightView& w : views) cpu::matmul(w, x.data(), g_tokens, y.data());
      const double s = g_cpu_time ? process_cpu_seconds() - c0 : timer.seconds();
      if (r >= 0) gbs.push_back(static_cast<double>(layer_bytes) * copies / s / 1e9);
    }
    uint32_t h = 0;  // the outputs (first of each matrix), the same for every thread count
    for (const WeightView& w : views) {
      cpu::matmul(w, x.data(), 1, y.data());
      uint32_t bits;
      std::memcpy(&bits, &y[0], 4);
      h = h * 31 + bits;
    }
    if (ti == 0) hash = h;
    same = same && h == hash;
    std::sort(gbs.begin(), gbs.end());
    std::printf(" %9.2f |", gbs[gbs.size() / 2]);
  }
  std::printf(" %08x%s |\n", hash, same ? "" : " DIFFERS between thread counts");
  std::fflush(stdout);
}

int run(int argc, char** argv) {
  std::vector<int>& threads = g_threads;
  threads = {1, 2};
  int& reps = g_reps;
  std::vector<GgmlType> types;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "-t") == 0 && i + 1 < argc) {
      threads.clear();
      for (char* tok = std::strtok(argv[++i], ","); tok != nullptr; tok = std::strtok(nullptr, ","))
        threads.push_back(std::max(1, std::atoi(tok)));
    } else if (std::strcmp(argv[i], "-r") == 0 && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "-n") == 0 && i + 1 < argc) {
      g_tokens = std::max(1, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--cpu-time") == 0) {
      g_cpu_time = true;
    } else if (std::strcmp(argv[i], "-h") == 0 || std::strcmp(argv[i], "--help") == 0) {
      std::puts("usage: bench_decode [-t 1,2] [-r REPS] [-n TOKENS] [--cpu-time] [TYPE...]");
      return 0;
    } else {
      types.push_back(parse_type(argv[i]));
    }
  }
  if (types.empty()) types.assign(std::begin(kDefaultTypes), std::end(kDefaultTypes));

  std::printf("decode matvec (1 token), Llama-3.2-1B layer shapes, isa %s, median of %d passes%s\n", cpu::isa_name(),
              reps, g_cpu_time ? ", GB per CPU-second" : "");
  std::printf("| type      | MB/layer | copies |");
  for (int t : threads) std::printf(" GB/s %dt |", t);
  std::printf(" hash     |\n");
  Rng rng(42);
  for (GgmlType type : types) {
    size_t layer_bytes = 0;
    for (const Shape& s : kLayer) layer_bytes += ggml_row_bytes(type, static_cast<size_t>(s.cols)) * s.rows;
    const int copies = static_cast<int>(std::max<size_t>(2, ((size_t{256} << 20) + layer_bytes - 1) / layer_bytes));
    AlignedBuffer<uint8_t> buf(layer_bytes * static_cast<size_t>(copies));
    fill_blocks(type, buf.data(), layer_bytes, rng);
    for (int c = 1; c < copies; ++c) std::memcpy(buf.data() + c * layer_bytes, buf.data(), layer_bytes);
    std::vector<WeightView> views;
    for (int c = 0; c < copies; ++c) {
      size_t off = c * layer_bytes;
      for (const Shape& s : kLayer) {
        const size_t rb = ggml_row_bytes(type, static_cast<size_t>(s.cols));
        views.push_back(WeightView{buf.data() + off, type, s.rows, s.cols, rb});
        off += rb * s.rows;
      }
    }
    // Each type once as the GGUF rows and, when the CPU backend packs it
    // (kernels::pack_weight, issue 22), once more through the packed copy.
    std::unique_ptr<PackedBuffer> packed;
    for (int pass = 0; pass < 2; ++pass) {
      if (pass == 1) {
        size_t total = 0;
        for (const WeightView& w : views) total += (packed_weight_bytes(w) + 63) / 64 * 64;
        if (total == 0) break;
        packed = std::make_unique<PackedBuffer>(total);
        size_t off = 0;
        for (WeightView& w : views) {
          pack_weight(w, packed->data() + off);
          w.packed = packed->data() + off;
          off += (packed_weight_bytes(w) + 63) / 64 * 64;
        }
      }
      const std::string name = std::string(ggml_type_info(type).name) + (pass == 1 ? " pk" : "");
      std::printf("| %-9s | %8.1f | %6d |", name.c_str(), layer_bytes / 1e6, copies);
      measure(views, layer_bytes, copies);
    }
  }
  return 0;
}

}  // namespace
}  // namespace pagoda::kernels

int main(int argc, char** argv) { return pagoda::kernels::run(argc, argv); }
