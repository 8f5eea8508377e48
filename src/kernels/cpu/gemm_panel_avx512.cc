// The many-token GEMM over packed Q4_0 / Q4_1 / Q8_0 weights (issue 23):
// its own translation unit (AVX-512 flags), called by matmul_avx512.cc's
// matmul_q32_t for packed weights from kPanelMinTokens tokens on.
//
// Why a second kernel: the direct kernel (qkernel_rows) holds one row's block
// in a vector (lane = 4 columns of one block) and must fold every token's lane
// sums into block sums with 9 shuffles and adds per 8 dpbusd. Here a vector
// holds 16 ROWS (lane i = row i, its 4 bytes = 4 columns of one block), so
// dpbusd against the token's 4 activation bytes broadcast to every lane leaves
// each row's exact block sum in its own lane, with no fold at all: per block
// and token, 8 dpbusd, then cvt, mul and one fma (Q4_1: two) for 16 outputs.
//
// Panels: a chunk's rows are restaged (once per chunk, for every token tile)
// from the packed 4-row tiles into 16-row panels; per block b of the row, a
// panel record (kPanelRec bytes) holds
//   q[j]  j = 0..7, 64 bytes each: lane i = row i's 4 values of columns
//         4j..4j+3 of block b, one byte each: Q4_0 / Q4_1 the nibbles 0..15
//         (split from the packed nibble bytes when staged), Q8_0 w + 128
//   wd    16 f32: lane i = row i's d of block b
//   wm    16 f32: row i's m (Q4_1; zero otherwise)
// Rows past the matrix are zero. Q4_0's -8 and Q8_0's +128 offsets are in the
// activation record's exact integer correction (lane 4b: ActMode::kImplicit8,
// kImplicit128), which starts the block's dpbusd chain.
//
// Batch invariance: the direct kernel gives row r the partial sums P_k (k =
// block index mod 4, one lane each) built per block as
//   P_k = fma(cvt(block sum), wd * xd, P_k)   [Q4_1: then P_k = fma(m, xs, P_k)]
// (the block sums exact integers) and returns (P_0 + P_2) + (P_1 + P_3). The
// panel kernel runs exactly those float ops on exactly those values (lane =
// row), so every output is bitwise what the direct kernel gives, whatever the
// token count, tile or thread. It builds P_0, then P_1, P_2, P_3, each over its
// blocks in order (in segments of the row whose activation records stay in L1),
// so only one partial sum per row and token is live, and takes two panels (32
// rows) by 6 tokens at once: each activation broadcast serves two dpbusd and
// each weight vector six (1B Q4_0 shapes at 512 tokens, 2 threads, Intel Xeon
// model 207: 2048 x 2048 and 8192 x 2048 630-730 -> 760-870 GFLOP/s against all
// four P_k live in a 16-row by 4-token tile, as before).
#include "kernels/cpu/gemm_panel_avx512.h"

#include <immintrin.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "base/check.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/pack.h"
#include "kernels/cpu/packed_avx512.h"
#include "kernels/cpu/thread_pool.h"

namespace pagoda::kernels::cpu::detail {
namespace {

// The activation records this kernel quantizes and reads (cpu_internal.h): 4
// blocks of 32 per record, as matmul_avx512.cc's kG.
constexpr int kG = 4;
constexpr size_t kRec = 64 * kG;  // record bytes
// Below this many multiply-adds a fork/join costs more than it saves.
constexpr int64_t kMinParallelMacs = 1 << 16;


constexpr int kPanelRows = 16;
constexpr int kPanelTokens = 6;  // tokens per register tile (by two panels)
constexpr int64_t kPanelPrefetch = 2;  // panels ahead that stage_panel prefetches

// 64-byte quant vectors per block of the packed tiles (Q8_0: bytes; Q4_0 /
// Q4_1: nibble bytes), and the panel record's bytes: 8 vectors of bytes (the
// nibbles are split at staging, once per chunk, not once per token tile:
// 1B Q4_0 shapes +8% on the Intel Xeon model 167), wd, wm.
constexpr int packed_qv(GgmlType t) { return t == GgmlType::Q8_0 ? 8 : 4; }
constexpr int kPanelQV = 8;
constexpr size_t kPanelRec = static_cast<size_t>(kPanelQV) * 64 + 128;

// In each 128-bit chunk c: lane 4c + r of result j = lane 4c + j of v[r] (a 4x4
// dword transpose inside every chunk).
inline void transpose_dwords_in_chunks(__m512i (&v)[4]) {
  const __m512i t0 = _mm512_unpacklo_epi32(v[0], v[1]), t1 = _mm512_unpackhi_epi32(v[0], v[1]);
  const __m512i t2 = _mm512_unpacklo_epi32(v[2], v[3]), t3 = _mm512_unpackhi_epi32(v[2], v[3]);
  v[0] = _mm512_unpacklo_epi64(t0, t2);
  v[1] = _mm512_unpackhi_epi64(t0, t2);
  v[2] = _mm512_unpacklo_epi64(t1, t3);
  v[3] = _mm512_unpackhi_epi64(t1, t3);
}

// Chunk q of result k = chunk k of v[q] (a 4x4 transpose of 128-bit chunks).
inline void transpose_chunks(__m512i (&v)[4]) {
  const __m512i s0 = _mm512_shuffle_i32x4(v[0], v[1], _MM_SHUFFLE(1, 0, 1, 0));
  const __m512i s1 = _mm512_shuffle_i32x4(v[0], v[1], _MM_SHUFFLE(3, 2, 3, 2));
  const __m512i s2 = _mm512_shuffle_i32x4(v[2], v[3], _MM_SHUFFLE(1, 0, 1, 0));
  const __m512i s3 = _mm512_shuffle_i32x4(v[2], v[3], _MM_SHUFFLE(3, 2, 3, 2));
  v[0] = _mm512_shuffle_i32x4(s0, s2, _MM_SHUFFLE(2, 0, 2, 0));
  v[1] = _mm512_shuffle_i32x4(s0, s2, _MM_SHUFFLE(3, 1, 3, 1));
  v[2] = _mm512_shuffle_i32x4(s1, s3, _MM_SHUFFLE(2, 0, 2, 0));
  v[3] = _mm512_shuffle_i32x4(s1, s3, _MM_SHUFFLE(3, 1, 3, 1));
}

// Restages panel p (rows 16p..16p+15) of a packed matrix: ng groups of 4
// panel records (blocks 4g..4g+3) at out.
template <GgmlType kType>
void stage_panel(const uint8_t* packed, const PackLayout& l, int64_t p, uint8_t* out) {
  static_assert(kPanelRows == 4 * kPackRows);
  constexpr size_t qb = pack_quant_bytes(kType), sb = pack_scale_bytes(kType), gb = pack_group_bytes(kType);
  constexpr int kQV = packed_qv(kType);
  const uint8_t* tile[4];
  for (int q = 0; q < 4; ++q) {
    const int64_t t = 4 * p + q;
    tile[q] = t < l.tiles ? packed + static_cast<size_t>(t) * l.tile_bytes : nullptr;
  }
  // packed scale 4r + k (row r, block k) -> lane 4k + r
  const __m512i tr = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  // A panel's 4 tiles are one contiguous stream; while staging it, prefetch
  // the stream kPanelPrefetch panels ahead in step with g (the hardware
  // prefetchers alone leave one core latency-bound on a large matrix, as in
  // qkernel_packed; into L2 on Intel cores: pp512 +1-1.5% in 3 rounds on the
  // Intel Xeon model 167). Past the buffer's end a prefetch is harmless.
  const size_t span = 4 * l.tile_bytes;
  const size_t step = (span + static_cast<size_t>(l.ng) - 1) / static_cast<size_t>(l.ng);
  const char* ahead = reinterpret_cast<const char*>(packed) + static_cast<size_t>(p + kPanelPrefetch) * span;
  for (int64_t g = 0; g < l.ng; ++g) {
    for (size_t b = 0; b < step; b += 64) prefetch_stream(ahead + static_cast<size_t>(g) * step + b);
    // u[j][q]: tile q's rows, dword j of each block (of the 64-byte half j / 4):
    // chunk k, lane r = row 4q + r's dword 4k + j % 4. Then transposing chunks
    // gives, per block k, lane 4q + r.
    __m512i u[kQV][4], wd[4], wm[4];
    for (int q = 0; q < 4; ++q) {
      if (tile[q] == nullptr) {
        for (int j = 0; j < kQV; ++j) u[j][q] = _mm512_setzero_si512();
        wd[q] = wm[q] = _mm512_setzero_si512();
        continue;
      }
      const uint8_t* qs = tile[q] + static_cast<size_t>(g) * gb;
      for (int h = 0; h < kQV / 4; ++h) {
        __m512i v[4];
        for (int r = 0; r < 4; ++r) v[r] = _mm512_load_si512(qs + r * qb + 64 * h);
        transpose_dwords_in_chunks(v);
        for (int j = 0; j < 4; ++j) u[4 * h + j][q] = v[j];
      }
      const uint8_t* s = tile[q] + l.scales_off + static_cast<size_t>(g) * sb;
      wd[q] = _mm512_castps_si512(packed_scales(s, tr));
      wm[q] = pack_has_min(kType) ? _mm512_castps_si512(packed_scales(s + 32, tr)) : _mm512_setzero_si512();
    }
    for (int j = 0; j < kQV; ++j) transpose_chunks(u[j]);
    transpose_chunks(wd);
    transpose_chunks(wm);
    for (int k = 0; k < 4; ++k) {
      uint8_t* rec = out + static_cast<size_t>(4 * g + k) * kPanelRec;
      if constexpr (kQV == kPanelQV) {
        for (int j = 0; j < kQV; ++j) _mm512_store_si512(rec + 64 * j, u[j][k]);
      } else {  // low nibbles (columns 4j..4j+3) to q[j], high (16 + 4j..) to q[4 + j]
        const __m512i nib = _mm512_set1_epi8(0x0F);
        for (int j = 0; j < kQV; ++j) {
          _mm512_store_si512(rec + 64 * j, _mm512_and_si512(u[j][k], nib));
          _mm512_store_si512(rec + 256 + 64 * j, _mm512_and_si512(_mm512_srli_epi16(u[j][k], 4), nib));
        }
      }
      _mm512_store_si512(rec + 64 * kPanelQV, wd[k]);
      _mm512_store_si512(rec + 64 * kPanelQV + 64, wm[k]);
    }
  }
}

inline __m512i bcast_u32(const uint8_t* p) { return _mm512_set1_epi32(static_cast<int>(load_u32(p))); }
inline __m512 bcast_f32(const uint8_t* p) { return _mm512_set1_ps(*reinterpret_cast<const float*>(p)); }

// R panels (rows 16r..16r+15 from pn[r]) times T tokens over the row's nb
// blocks; x[t] activation rows (quantize_act records), out[r * T + t] 16 floats
// (lane i = row i; lanes off in mask[r] are not stored).
//
// Passes: P_0, then P_1, P_2, P_3, each over its blocks (index k mod 4) in
// order, exactly the order the direct kernel gives them, so only one partial
// sum per row and token is live and the register tile can be two panels by six
// tokens: each activation broadcast serves R dpbusd and each weight vector T.
// The passes run over segments of seg blocks (a multiple of 4, so that a
// segment's blocks keep their index mod 4), whose activation records stay in
// L1 for the four passes; each P_k carries over from one segment to the next,
// so its blocks still come in order. A block's integer sum is one dpbusd chain
// per token (columns 0..15, then 16..31), started at the record's offset
// correction without m: exact integers, the same block sum as two chains added.
//
// The zero-padded blocks of the last group (nb % 4 != 0), which the direct
// kernel adds in, are skipped: they add fma(0, dd, P) (and fma(m, 0, P)) terms of
// +-0 to partial sums that start at +0 and so are never -0 (round to nearest
// gives +0 for an exact zero sum unless both addends are -0, and no nonzero
// product of f16-derived scales is small enough to round to -0), which leaves
// every P unchanged: the same bits either way.
template <GgmlType kType, int T, int R>
void panel_kernel(const uint8_t* const* pn, const uint8_t* const* x, int64_t nb, int64_t seg, float* const* out,
                  const __mmask16* mask) {
  constexpr bool kMin = pack_has_min(kType);
  __m512 part[4][R][T];
  for (int k = 0; k < 4; ++k)
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) part[k][r][t] = _mm512_setzero_ps();
  for (int64_t s0 = 0; s0 < nb; s0 += seg) {
    const int64_t s1 = std::min(nb, s0 + seg);
    for (int k = 0; k < 4; ++k) {
      __m512 acc[R][T];
      for (int r = 0; r < R; ++r)
        for (int t = 0; t < T; ++t) acc[r][t] = part[k][r][t];
      for (int64_t b = s0 + k; b < s1; b += 4) {
        const uint8_t* rec[R];
        for (int r = 0; r < R; ++r) rec[r] = pn[r] + static_cast<size_t>(b) * kPanelRec;
        const size_t xo = static_cast<size_t>(b / 4) * kRec + 16 * k;
        __m512i sum[R][T];
        for (int t = 0; t < T; ++t) {
          const __m512i c = kMin ? _mm512_setzero_si512() : bcast_u32(x[t] + xo + 192);
          for (int r = 0; r < R; ++r) sum[r][t] = c;
        }
        for (int j = 0; j < 8; ++j) {  // q[j]: columns 4j.. (j < 4), 16 + 4(j - 4).. (j >= 4)
          const size_t xj = j < 4 ? 4 * j : 64 + 4 * (j - 4);
          __m512i wv[R];
          for (int r = 0; r < R; ++r) wv[r] = _mm512_load_si512(rec[r] + 64 * j);
          for (int t = 0; t < T; ++t) {
            const __m512i xb = bcast_u32(x[t] + xo + xj);
            for (int r = 0; r < R; ++r) sum[r][t] = _mm512_dpbusd_epi32(sum[r][t], wv[r], xb);
          }
        }
        __m512 wd[R], wm[R];
        for (int r = 0; r < R; ++r) {
          wd[r] = _mm512_load_ps(reinterpret_cast<const float*>(rec[r] + 64 * kPanelQV));
          if constexpr (kMin) wm[r] = _mm512_load_ps(reinterpret_cast<const float*>(rec[r] + 64 * kPanelQV + 64));
        }
        for (int t = 0; t < T; ++t) {
          const __m512 xd = bcast_f32(x[t] + xo + 128);  // xd, block b
          for (int r = 0; r < R; ++r) {
            acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[r][t]), _mm512_mul_ps(wd[r], xd), acc[r][t]);
          }
          if constexpr (kMin) {  // m * xs, block b
            const __m512 xs = bcast_f32(x[t] + xo + 192);
            for (int r = 0; r < R; ++r) acc[r][t] = _mm512_fmadd_ps(wm[r], xs, acc[r][t]);
          }
        }
      }
      for (int r = 0; r < R; ++r)
        for (int t = 0; t < T; ++t) part[k][r][t] = acc[r][t];
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) {
      const __m512 v =
          _mm512_add_ps(_mm512_add_ps(part[0][r][t], part[2][r][t]), _mm512_add_ps(part[1][r][t], part[3][r][t]));
      _mm512_mask_storeu_ps(out[r * T + t], mask[r], v);
    }
  }
}

// The panel kernel for nt (1..kPanelTokens) tokens.
template <GgmlType kType, int R>
void panel_tile(int nt, const uint8_t* const* pn, const uint8_t* const* x, int64_t nb, int64_t seg, float* const* out,
                const __mmask16* mask) {
  switch (nt) {
    case 1: panel_kernel<kType, 1, R>(pn, x, nb, seg, out, mask); break;
    case 2: panel_kernel<kType, 2, R>(pn, x, nb, seg, out, mask); break;
    case 3: panel_kernel<kType, 3, R>(pn, x, nb, seg, out, mask); break;
    case 4: panel_kernel<kType, 4, R>(pn, x, nb, seg, out, mask); break;
    case 5: panel_kernel<kType, 5, R>(pn, x, nb, seg, out, mask); break;
    default: panel_kernel<kType, 6, R>(pn, x, nb, seg, out, mask); break;
  }
}

// The core's L1 data cache (32 KiB where the system does not say).
size_t l1d_bytes() {
  const long l1 = sysconf(_SC_LEVEL1_DCACHE_SIZE);
  return l1 > 0 ? static_cast<size_t>(l1) : size_t{32} << 10;
}

// The staged panels of a chunk: at least 256 KiB; a quarter of the core's L2
// where it is under 2 MiB (Zen 4/5: 1 MiB L2, 256 KiB as measured there), half
// where it is 2 MiB or more. Every chunk re-reads all the tokens' activation
// records, so more panels a chunk read them fewer times: the 1B down projection
// (2048 x 8192, 512 tokens: 8 MiB of records, from L3) took 2 panels a chunk at
// a quarter, 6 at half, 636-699 -> 698-806 GFLOP/s (Intel Xeon model 207, 2
// threads); at a quarter against 256 KiB it went 600 -> 680-710 (model 167).
size_t chunk_bytes() {
  const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
  const size_t l2b = l2 > 0 ? static_cast<size_t>(l2) : 0;
  return std::max<size_t>(256u << 10, l2b >= (size_t{2} << 20) ? l2b / 2 : l2b / 4);
}

// y = W x through the panels: chunks of whole panels split over the threads;
// each chunk restages its panels once, then runs every token tile over them
// (token tiles outer: a tile's activations stay in L1 under the chunk's panels).

}  // namespace

template <GgmlType kType>
void matmul_panels(const WeightView& w, const float* x, int64_t n_tokens, float* y) {
  const PackLayout l = pack_layout(kType, w.rows, w.cols);
  const int64_t ng = act_groups(w.cols, kG), nb = w.cols / 32;
  PAGODA_CHECK(ng == l.ng);
  const size_t xrow = static_cast<size_t>(ng) * kRec;
  uint8_t* act = scratch(0, static_cast<size_t>(n_tokens) * xrow);
  // Q8_0: the block's correction in one lane (the direct kernel's per-lane
  // kLaneCorr128 sums to the same exact block sums).
  const ActMode mode = kType == GgmlType::Q8_0 ? ActMode::kImplicit128 : act_mode_for(kType, /*avx512=*/true, true);
  quantize_act(x, n_tokens, w.cols, kG, mode, act);
  const int64_t n_panels = (w.rows + kPanelRows - 1) / kPanelRows;
  const int nth = threads();
  // Panels per chunk: a chunk's staged panels (ng * 4 * kPanelRec bytes each)
  // stay in L2 for the token tiles, and each chunk reads every token's
  // activations once (so bigger chunks read them less often), while each thread
  // still gets at least 8 chunks: loop items are claimed dynamically, so a
  // thread ends at most one chunk after the other.
  const size_t panel_bytes = static_cast<size_t>(ng) * 4 * kPanelRec;
  static const size_t kChunkBytes = chunk_bytes();
  int64_t per_chunk = std::max<int64_t>(1, static_cast<int64_t>(kChunkBytes / panel_bytes));
  per_chunk = std::min(per_chunk, std::max<int64_t>(1, n_panels / (8 * nth)));
  if (per_chunk > 1) per_chunk &= ~int64_t{1};  // whole pairs of panels for the 2-panel tiles
  const int64_t n_chunks = (n_panels + per_chunk - 1) / per_chunk;
  const uint8_t* packed = static_cast<const uint8_t*>(w.packed);
  const bool big = w.rows * w.cols * n_tokens >= kMinParallelMacs;
  // Blocks per segment of the passes: a tile's records of a segment (64 bytes a
  // block and token) take half the core's L1, in whole groups of 4 blocks (1B
  // Q4_0 2048 x 8192, 512 tokens, 2 threads, Intel Xeon model 207: the whole L1
  // 575-648 GFLOP/s, half 688-725, no segments (one pass over all 8192 columns
  // per P_k) 626-686; 2048-column rows are one segment either way).
  static const size_t kL1 = l1d_bytes();
  const int64_t seg = std::max<int64_t>(4, static_cast<int64_t>(kL1 / 2 / (64 * kPanelTokens)) / 4 * 4);
  parallel_for(n_chunks, big ? nth : 1, [=](int64_t ch) {
    const int64_t p0 = ch * per_chunk, np = std::min(per_chunk, n_panels - p0);
    uint8_t* st = scratch(1, static_cast<size_t>(np) * panel_bytes);
    for (int64_t i = 0; i < np; ++i) stage_panel<kType>(packed, l, p0 + i, st + static_cast<size_t>(i) * panel_bytes);
    for (int64_t t0 = 0; t0 < n_tokens; t0 += kPanelTokens) {
      const int nt = static_cast<int>(std::min<int64_t>(kPanelTokens, n_tokens - t0));
      const uint8_t* xp[kPanelTokens];
      for (int t = 0; t < nt; ++t) xp[t] = act + static_cast<size_t>(t0 + t) * xrow;
      for (int64_t i = 0; i < np; i += 2) {  // two panels at a time, the chunk's odd last one alone
        const int r = np - i >= 2 ? 2 : 1;
        const uint8_t* pn[2];
        float* op[2 * kPanelTokens];
        __mmask16 m[2];
        for (int h = 0; h < r; ++h) {
          const int64_t row0 = (p0 + i + h) * kPanelRows;
          m[h] = static_cast<__mmask16>((1u << std::min<int64_t>(kPanelRows, w.rows - row0)) - 1);
          pn[h] = st + static_cast<size_t>(i + h) * panel_bytes;
          for (int t = 0; t < nt; ++t) op[h * nt + t] = y + (t0 + t) * w.rows + row0;
        }
        if (r == 2) {
          panel_tile<kType, 2>(nt, pn, xp, nb, seg, op, m);
        } else {
          panel_tile<kType, 1>(nt, pn, xp, nb, seg, op, m);
        }
      }
    }
  });
}

template void matmul_panels<GgmlType::Q4_0>(const WeightView&, const float*, int64_t, float*);
template void matmul_panels<GgmlType::Q4_1>(const WeightView&, const float*, int64_t, float*);
template void matmul_panels<GgmlType::Q8_0>(const WeightView&, const float*, int64_t, float*);

}  // namespace pagoda::kernels::cpu::detail
