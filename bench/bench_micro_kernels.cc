// Kernel micro-benchmarks: matmul (GEMV GB/s of weight bytes, GEMM GFLOP/s) at
// SmolLM2-135M shapes, and paged attention. GEMV cycles through enough weight
// copies (>= 256 MiB) that every call streams from DRAM, as in a real decode.
// Counters: GB/s (weight bytes / time), GFLOP/s (2 * rows * cols * n / time),
// hash (xor of the output bits, so a faster run that changed the answer shows).
// Machine peak for context: ~30 GB/s read, ~580 GFLOP/s fp32 FMA on 2 threads.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "base/aligned.h"
#include "base/fp16.h"
#include "base/rng.h"
#include "kernels/api.h"
#include "kernels/backend.h"

namespace pagoda::kernels {
namespace {

// Valid random weights of `type`, replicated into `copies` copies.
struct WeightSet {
  AlignedBuffer<uint8_t> bytes;
  AlignedBuffer<uint8_t> packed;  // the load-time packed copy of copy 0 (PAGODA_BENCH_PACK=1), else empty
  size_t bytes_per_copy = 0;
  int copies = 1;
  WeightView view(int i) const {
    WeightView v;
    v.data = bytes.data() + static_cast<size_t>(i % copies) * bytes_per_copy;
    v.type = type;
    v.rows = rows;
    v.cols = cols;
    v.row_bytes = ggml_row_bytes(type, static_cast<size_t>(cols));
    if (packed.size() > 0 && i % copies == 0) v.packed = packed.data();
    return v;
  }
  GgmlType type;
  int64_t rows, cols;
};

void put_f16(uint8_t* p, float v) {
  const uint16_t h = fp32_to_fp16(v);
  std::memcpy(p, &h, 2);
}

std::unique_ptr<WeightSet> make_set(GgmlType type, int64_t rows, int64_t cols, size_t min_total) {
  auto s = std::make_unique<WeightSet>();
  s->type = type;
  s->rows = rows;
  s->cols = cols;
  s->bytes_per_copy = ggml_row_bytes(type, static_cast<size_t>(cols)) * static_cast<size_t>(rows);
  s->copies = static_cast<int>((min_total + s->bytes_per_copy - 1) / s->bytes_per_copy);
  if (s->copies < 1) s->copies = 1;
  s->bytes.resize(s->bytes_per_copy * static_cast<size_t>(s->copies));
  Rng rng(42);
  uint8_t* p = s->bytes.data();
  for (size_t i = 0; i < s->bytes_per_copy; ++i) p[i] = static_cast<uint8_t>(rng.next_u64());
  const auto& info = ggml_type_info(type);
  const size_t nblocks = s->bytes_per_copy / info.type_size;
  for (size_t b = 0; b < nblocks; ++b) {
    uint8_t* blk = p + b * info.type_size;
    switch (type) {
      case GgmlType::F16: put_f16(blk, static_cast<float>(rng.normal())); break;
      case GgmlType::Q4_1: put_f16(blk, 0.01f); put_f16(blk + 2, -0.08f); break;
      case GgmlType::Q2_K: put_f16(blk + 80, 0.01f); put_f16(blk + 82, 0.01f); break;
      case GgmlType::Q3_K: put_f16(blk + 108, 0.01f); break;
      case GgmlType::Q4_K: case GgmlType::Q5_K: put_f16(blk, 0.001f); put_f16(blk + 2, 0.001f); break;
      case GgmlType::Q6_K: put_f16(blk + 208, 0.001f); break;
      default: put_f16(blk, 0.01f); break;  // Q4_0, Q8_0: d first
    }
  }
  for (int c = 1; c < s->copies; ++c) std::memcpy(p + c * s->bytes_per_copy, p, s->bytes_per_copy);
  // PAGODA_BENCH_PACK=1: GEMM shapes (one copy) read the packed copy a model load makes.
  if (s->copies == 1 && std::getenv("PAGODA_BENCH_PACK") != nullptr) {
    const WeightView v = s->view(0);
    if (const size_t n = packed_weight_bytes(v); n > 0) {
      s->packed.resize(n);
      pack_weight(v, s->packed.data());
    }
  }
  return s;
}

// Rates default to the main thread's CPU time, which is right for thr=1 even on
// a busy machine. PAGODA_BENCH_REALTIME=1 switches to wall time: use it for
// thr>1 on an otherwise idle machine (CPU time of one thread undercounts a team).
bool real_time() { return std::getenv("PAGODA_BENCH_REALTIME") != nullptr; }

uint32_t hash_out(const std::vector<float>& y) {
  uint32_t h = 0;
  for (float f : y) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    h = (h ^ u) * 16777619u;
  }
  return h;
}

// args: type, rows, cols, n_tokens, threads
void BM_Matmul(benchmark::State& st) {
  const auto type = static_cast<GgmlType>(st.range(0));
  const int64_t rows = st.range(1), cols = st.range(2), n = st.range(3);
  set_num_threads(static_cast<int>(st.range(4)));
  // PAGODA_BENCH_HOT=1: reuse one copy (cache-resident) to separate compute from DRAM cost.
  const bool hot = std::getenv("PAGODA_BENCH_HOT") != nullptr;
  const size_t min_total = n == 1 && !hot ? (size_t{640} << 20) : 0;
  static std::unique_ptr<WeightSet> cache;
  if (!cache || cache->type != type || cache->rows != rows || cache->cols != cols ||
      (cache->copies == 1 && min_total > 0))
    cache = make_set(type, rows, cols, min_total);
  const WeightSet& ws = *cache;
  Rng rng(1);
  std::vector<float> x(static_cast<size_t>(n * cols)), y(static_cast<size_t>(n * rows));
  for (auto& v : x) v = static_cast<float>(rng.normal());
  int i = 0;
  for (auto _ : st) {
    cpu::matmul(ws.view(i++), x.data(), n, y.data());
    benchmark::DoNotOptimize(y.data());
  }
  const double calls = static_cast<double>(st.iterations());
  st.counters["GB/s"] = benchmark::Counter(calls * static_cast<double>(ws.bytes_per_copy) / 1e9,
                                           benchmark::Counter::kIsRate);
  st.counters["GFLOP/s"] = benchmark::Counter(calls * 2.0 * static_cast<double>(rows * cols * n) / 1e9,
                                              benchmark::Counter::kIsRate);
  st.counters["hash"] = static_cast<double>(hash_out(y) & 0xFFFFFF);
  st.SetLabel(std::string(ggml_type_info(type).name) + " " + cpu::isa_name());
}

void MatmulArgs(benchmark::internal::Benchmark* b) {
  const int64_t shapes[][2] = {{576, 576}, {1536, 576}, {576, 1536}, {49152, 576}};
  for (auto t : {GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::F16})
    for (auto& s : shapes)
      for (int64_t n : {1, 32, 128, 512}) {
        if (s[0] == 49152 && n > 128) continue;
        for (int64_t thr : {1, 2}) b->Args({static_cast<int64_t>(t), s[0], s[1], n, thr});
      }
  b->ArgNames({"type", "rows", "cols", "n", "thr"});
  b->Unit(benchmark::kMicrosecond);
  b->MinTime(0.2);
  if (real_time()) b->UseRealTime();
}
BENCHMARK(BM_Matmul)->Apply(MatmulArgs);

// K-quant weights (q8_K integer paths): rows of whole 256-value super-blocks,
// llama-3.2-1b-like shapes (attn 2048 x 2048, ffn 8192 x 2048 and 2048 x 8192).
void KQuantMatmulArgs(benchmark::internal::Benchmark* b) {
  const int64_t shapes[][2] = {{2048, 2048}, {8192, 2048}, {2048, 8192}};
  for (auto t : {GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K})
    for (auto& s : shapes)
      for (int64_t n : {1, 32, 128})
        for (int64_t thr : {1, 2}) b->Args({static_cast<int64_t>(t), s[0], s[1], n, thr});
  b->ArgNames({"type", "rows", "cols", "n", "thr"});
  b->Unit(benchmark::kMicrosecond);
  b->MinTime(0.2);
  if (real_time()) b->UseRealTime();
}
BENCHMARK(BM_Matmul)->Name("BM_MatmulKQuant")->Apply(KQuantMatmulArgs);

// Q4_0 / Q4_1 prefill GEMM at the llama-3.2-1b shapes (issue 23); run with
// PAGODA_BENCH_PACK=1 for the packed path a loaded model takes.
void Q4GemmArgs(benchmark::internal::Benchmark* b) {
  const int64_t shapes[][2] = {{2048, 2048}, {8192, 2048}, {2048, 8192}};
  for (auto t : {GgmlType::Q4_0, GgmlType::Q4_1})
    for (auto& s : shapes)
      for (int64_t n : {16, 64, 512})
        for (int64_t thr : {1, 2}) b->Args({static_cast<int64_t>(t), s[0], s[1], n, thr});
  b->ArgNames({"type", "rows", "cols", "n", "thr"});
  b->Unit(benchmark::kMillisecond);
  b->MinTime(0.2);
  if (real_time()) b->UseRealTime();
}
BENCHMARK(BM_Matmul)->Name("BM_MatmulQ4Gemm")->Apply(Q4GemmArgs);

// Paged attention, SmolLM2 layer shape (9 heads, 3 kv heads, head_dim 64, pages
// of 16). args: kv dtype, context length, new tokens per sequence, sequences.
void BM_PagedAttention(benchmark::State& st) {
  const auto dtype = static_cast<KvDtype>(st.range(0));
  const int32_t ctx = static_cast<int32_t>(st.range(1)), nq = static_cast<int32_t>(st.range(2));
  const int32_t n_seqs = static_cast<int32_t>(st.range(3));
  set_num_threads(static_cast<int>(st.range(4)));
  const int32_t n_heads = 9, n_kv = 3, hd = 64, bs = 16;
  const int32_t pages_per_seq = (ctx + bs - 1) / bs;
  KvLayerView kv;
  kv.dtype = dtype;
  kv.block_size = bs;
  kv.n_kv_heads = n_kv;
  kv.head_dim = hd;
  kv.row_bytes = kv_row_bytes(dtype, n_kv * hd);
  kv.v_dtype = dtype;
  kv.v_row_bytes = kv.row_bytes;
  const size_t slots = static_cast<size_t>(pages_per_seq) * n_seqs * bs;
  AlignedBuffer<uint8_t> kbuf(slots * kv.row_bytes), vbuf(slots * kv.row_bytes);
  kv.k = kbuf.data();
  kv.v = vbuf.data();
  Rng rng(3);
  std::vector<float> row(static_cast<size_t>(n_kv * hd));
  std::vector<int64_t> slot_ids(slots);
  for (size_t s = 0; s < slots; ++s) slot_ids[s] = static_cast<int64_t>(s);
  for (size_t s = 0; s < slots; s += 64) {
    const size_t n = std::min<size_t>(64, slots - s);
    std::vector<float> k(n * row.size()), v(n * row.size());
    for (auto& f : k) f = static_cast<float>(rng.normal());
    for (auto& f : v) f = static_cast<float>(rng.normal());
    kv_write(kv, k.data(), v.data(), slot_ids.data() + s, static_cast<int64_t>(n));
  }
  std::vector<int32_t> q_indptr{0}, kv_indptr{0}, indices, last, positions;
  for (int32_t s = 0; s < n_seqs; ++s) {
    for (int32_t i = 0; i < nq; ++i) positions.push_back(ctx - nq + i);
    q_indptr.push_back(q_indptr.back() + nq);
    for (int32_t p = 0; p < pages_per_seq; ++p) indices.push_back(s * pages_per_seq + p);
    kv_indptr.push_back(kv_indptr.back() + pages_per_seq);
    last.push_back(ctx - (pages_per_seq - 1) * bs);
  }
  BatchView b;
  b.n_tokens = nq * n_seqs;
  b.n_seqs = n_seqs;
  b.positions = positions.data();
  b.q_indptr = q_indptr.data();
  b.kv_indptr = kv_indptr.data();
  b.kv_indices = indices.data();
  b.kv_last_page_len = last.data();
  std::vector<float> q(static_cast<size_t>(b.n_tokens) * n_heads * hd), out(q.size());
  for (auto& f : q) f = static_cast<float>(rng.normal());
  for (auto _ : st) {
    cpu::paged_attention(q.data(), kv, b, n_heads, 0.125f, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  double keys = 0;  // (query, key) pairs per call
  for (int32_t i = 0; i < nq; ++i) keys += ctx - nq + i + 1;
  keys *= n_seqs;
  st.counters["GFLOP/s"] = benchmark::Counter(static_cast<double>(st.iterations()) * keys * n_heads * hd * 4 / 1e9,
                                              benchmark::Counter::kIsRate);
  st.counters["hash"] = static_cast<double>(hash_out(out) & 0xFFFFFF);
  st.SetLabel(kv_dtype_name(dtype));
}
BENCHMARK(BM_PagedAttention)
    ->ArgNames({"dtype", "ctx", "nq", "seqs", "thr"})
    ->Args({0, 512, 1, 1, 1})->Args({1, 512, 1, 1, 1})->Args({3, 512, 1, 1, 1})
    ->Args({0, 2048, 1, 1, 1})->Args({3, 2048, 1, 1, 1})->Args({4, 2048, 1, 1, 1})->Args({6, 2048, 1, 1, 1})
    ->Args({0, 512, 1, 32, 1})->Args({3, 512, 1, 32, 1})->Args({0, 512, 1, 32, 2})
    ->Args({0, 512, 512, 1, 1})->Args({1, 512, 512, 1, 1})->Args({0, 512, 512, 1, 2})
    ->Unit(benchmark::kMicrosecond)->MinTime(0.2)->Apply([](benchmark::internal::Benchmark* b) {
      if (real_time()) b->UseRealTime();
    });

// Qwen3.5's gated delta rule at Qwen3.5-0.8B's decode shape (16 v and 16 k heads
// of 128, one token), one layer's state of 1 MiB per call, cycling through 18
// layers' states (18 MiB: from DRAM / L3 as a real decode step). args: impl
// (0 ref scalar, 1 cpu AVX2, 2 cpu AVX-512), tokens, threads. Counter: states/s
// read and written (GB/s of state bytes).
void BM_GatedDeltaNet(benchmark::State& st) {
  const int impl = static_cast<int>(st.range(0));
  const int32_t T = static_cast<int32_t>(st.range(1));
  set_num_threads(static_cast<int>(st.range(2)));
  if (impl > 0 && !cpu::set_isa(impl == 1 ? "avx2" : "avx512-vnni")) {
    st.SkipWithError("ISA not supported here");
    return;
  }
  const int32_t S = 128, H = 16, layers = 18;
  Rng rng(35);
  std::vector<float> qkv(static_cast<size_t>(T) * 3 * H * S), ab(static_cast<size_t>(T) * H), dt(H), a(H);
  for (auto& f : qkv) f = static_cast<float>(rng.normal());
  for (auto& f : ab) f = static_cast<float>(rng.normal());
  for (int32_t h = 0; h < H; ++h) a[static_cast<size_t>(h)] = -1.0f - static_cast<float>(h);
  AlignedBuffer<float> states(static_cast<size_t>(layers) * H * S * S);
  std::memset(states.data(), 0, states.size() * sizeof(float));
  std::vector<float*> rows;
  for (size_t r = 0; r < static_cast<size_t>(layers) * H * S; ++r) rows.push_back(states.data() + r * S);
  std::vector<float> out(static_cast<size_t>(T) * H * S);
  GatedDeltaNetArgs g;
  g.qkv = qkv.data();
  g.ld = 3 * H * S;
  g.alpha = ab.data();
  g.beta = ab.data();
  g.ld_ab = H;
  g.dt_bias = dt.data();
  g.ssm_a = a.data();
  g.n_tokens = T;
  g.S = S;
  g.H_k = H;
  g.H_v = H;
  g.out = out.data();
  int layer = 0;
  for (auto _ : st) {
    g.state = rows.data() + static_cast<size_t>(layer) * H * S;
    layer = (layer + 1) % layers;
    if (impl == 0) ref::gated_delta_net(g);
    else cpu::gated_delta_net(g);
    benchmark::DoNotOptimize(out.data());
  }
  cpu::set_isa("auto");
  st.counters["GB/s"] = benchmark::Counter(static_cast<double>(st.iterations()) * 2.0 * H * S * S * 4 / 1e9,
                                           benchmark::Counter::kIsRate);
  st.SetLabel(impl == 0 ? "ref" : impl == 1 ? "avx2" : "avx512");
}
BENCHMARK(BM_GatedDeltaNet)
    ->ArgNames({"impl", "tokens", "thr"})
    ->Args({0, 1, 1})->Args({1, 1, 1})->Args({2, 1, 1})->Args({1, 1, 2})->Args({2, 1, 2})
    ->Args({0, 64, 1})->Args({1, 64, 1})->Args({2, 64, 1})
    ->Unit(benchmark::kMicrosecond)->MinTime(0.2)->Apply([](benchmark::internal::Benchmark* b) {
      if (real_time()) b->UseRealTime();
    });

}  // namespace
}  // namespace pagoda::kernels

BENCHMARK_MAIN();
