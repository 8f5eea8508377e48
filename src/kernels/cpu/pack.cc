// Packs Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 matrices into the decode layout of
// pack.h (once, at model load; plain byte copies, so any ISA can run it), and
// Q2_K / Q3_K / Q4_K / Q5_K / Q6_K / IQ4_XS into the AVX-512 K-quant layout
// (kquant_layouts_avx512.h, KTileSet::pack).
#include "kernels/cpu/pack.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "base/check.h"
#include "base/ggml_quant.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/kquant.h"

namespace pagoda::kernels {
namespace {

using cpu::detail::kPackBlocks;
using cpu::detail::kPackRows;

struct PackJob {
  const WeightView* w;
  cpu::detail::PackLayout l;
  uint8_t* dst;
};

// Byte offsets of a block's f16 d, f16 m (Q4_1 / Q5_1), u32 qh (Q5_0 / Q5_1) and quants.
struct BlockFields {
  size_t bytes, m, qh, qs;
};
BlockFields fields_of(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0: return {18, 0, 0, 2};
    case GgmlType::Q4_1: return {20, 2, 0, 4};
    case GgmlType::Q5_0: return {22, 0, 2, 6};
    case GgmlType::Q5_1: return {24, 2, 4, 8};
    default: return {34, 0, 0, 2};  // Q8_0
  }
}

// Block b's qh (bit j = high bit of value j) into row r's two u64 masks of a
// group's qh line (pack.h): bits 0..15 to the values-0..15 mask, bits 16..31
// to the values-16..31 mask, each at bits 16b..16b+15 (little-endian u16s).
void put_qh(uint8_t* line, int r, int b, const uint8_t* qh) {
  std::memcpy(line + 16 * r + 2 * b, qh, 2);
  std::memcpy(line + 16 * r + 8 + 2 * b, qh + 2, 2);
}

void pack_tile(void* ctx, int64_t tile) {
  const PackJob& job = *static_cast<const PackJob*>(ctx);
  const WeightView& w = *job.w;
  const GgmlType t = w.type;
  const BlockFields f = fields_of(t);
  const size_t qb = cpu::detail::pack_quant_bytes(t), sb = cpu::detail::pack_scale_bytes(t);
  const size_t gb = cpu::detail::pack_group_bytes(t);
  const bool has_min = cpu::detail::pack_has_min(t), has_qh = cpu::detail::pack_has_qh(t);
  const int64_t nb = w.cols / 32;
  uint8_t* out = job.dst + static_cast<size_t>(tile) * job.l.tile_bytes;
  std::memset(out, 0, job.l.tile_bytes);
  for (int r = 0; r < kPackRows; ++r) {
    const int64_t row = tile * kPackRows + r;
    const bool live = row < w.rows;
    const uint8_t* src = live ? static_cast<const uint8_t*>(w.data) + static_cast<size_t>(row) * w.row_bytes : nullptr;
    for (int64_t g = 0; g < job.l.ng; ++g) {
      uint8_t* q = out + static_cast<size_t>(g) * gb + static_cast<size_t>(r) * qb;
      uint8_t* s = out + job.l.scales_off + static_cast<size_t>(g) * sb;
      for (int b = 0; b < kPackBlocks; ++b) {
        const int64_t blk = g * kPackBlocks + b;
        const uint8_t* bp = live && blk < nb ? src + static_cast<size_t>(blk) * f.bytes : nullptr;
        if (t == GgmlType::Q8_0) {
          // u8 = q + 128 (a padded block: q = 0); bytes 0..15 to lo, 16..31 to hi.
          for (int i = 0; i < 16; ++i) {
            q[16 * b + i] = static_cast<uint8_t>((bp ? bp[f.qs + i] : 0) ^ 0x80);
            q[64 + 16 * b + i] = static_cast<uint8_t>((bp ? bp[f.qs + 16 + i] : 0) ^ 0x80);
          }
        } else if (bp) {
          std::memcpy(q + 16 * b, bp + f.qs, 16);
          if (has_qh) put_qh(out + static_cast<size_t>(g) * gb + kPackRows * qb, r, b, bp + f.qh);
        }
        if (bp) {
          std::memcpy(s + 2 * (4 * r + b), bp, 2);                                // d
          if (has_min) std::memcpy(s + 32 + 2 * (4 * r + b), bp + f.m, 2);  // m
        }
      }
    }
  }
}

struct KPackJob {
  const WeightView* w;
  cpu::detail::KPackFn pack;
  size_t chunk_bytes;
  uint8_t* dst;
};

void kpack_chunk(void* ctx, int64_t chunk) {
  const KPackJob& job = *static_cast<const KPackJob*>(ctx);
  const WeightView& w = *job.w;
  const int64_t r0 = chunk * cpu::detail::kKChunkRows, nr = std::min(cpu::detail::kKChunkRows, w.rows - r0);
  job.pack(static_cast<const uint8_t*>(w.data) + static_cast<size_t>(r0) * w.row_bytes, w.row_bytes, nr, w.cols / 256,
           job.dst + static_cast<size_t>(chunk) * job.chunk_bytes);
}

int64_t kchunks(const WeightView& w) { return (w.rows + cpu::detail::kKChunkRows - 1) / cpu::detail::kKChunkRows; }

}  // namespace

namespace cpu::detail {
size_t kpacked_bytes(const WeightView& w) {
  if (!is_kquant_type(w.type) || isa() != Isa::kAvx512 || w.rows <= 0 || w.cols <= 0 || w.cols % 256 != 0) return 0;
  return static_cast<size_t>(kchunks(w) * (w.cols / 256)) * ktiles_avx512(w.type).packed_sb_bytes;
}
}  // namespace cpu::detail

size_t packed_weight_bytes(const WeightView& w) {
  if (cpu::detail::is_kquant_type(w.type)) return cpu::detail::kpacked_bytes(w);
  if (!cpu::detail::is_packable_type(w.type) || cpu::detail::isa() != cpu::detail::Isa::kAvx512) return 0;
  if (w.rows <= 0 || w.cols <= 0 || w.cols % 32 != 0) return 0;
  return cpu::detail::pack_layout(w.type, w.rows, w.cols).total();
}

void pack_weight(const WeightView& w, uint8_t* dst) {
  PAGODA_CHECK(reinterpret_cast<uintptr_t>(dst) % 64 == 0);
  if (cpu::detail::is_kquant_type(w.type)) {
    PAGODA_CHECK(cpu::detail::kpacked_bytes(w) > 0);
    const cpu::detail::KTileSet& ts = cpu::detail::ktiles_avx512(w.type);
    KPackJob job{&w, ts.pack, static_cast<size_t>(w.cols / 256) * ts.packed_sb_bytes, dst};
    parallel_for(kchunks(w), kpack_chunk, &job);
    return;
  }
  PAGODA_CHECK(cpu::detail::is_packable_type(w.type) && w.cols % 32 == 0 && w.rows > 0);
  PackJob job{&w, cpu::detail::pack_layout(w.type, w.rows, w.cols), dst};
  parallel_for(job.l.tiles, pack_tile, &job);
}

PackedBuffer::PackedBuffer(size_t bytes) : size_(bytes) {
  if (bytes == 0) return;
  constexpr size_t kHuge = size_t{2} << 20;
  map_bytes_ = (bytes + kHuge - 1) / kHuge * kHuge + kHuge;
  void* p = ::mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  PAGODA_CHECK_MSG(p != MAP_FAILED, "cannot map %zu bytes for packed weights", map_bytes_);
  map_ = static_cast<uint8_t*>(p);
  data_ = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(map_) + kHuge - 1) / kHuge * kHuge);
  // Advice only: without THP (or with it off) the buffer is plain 4 KiB pages.
  const char* env = std::getenv("PAGODA_PACK_THP");
  if (env == nullptr || std::strcmp(env, "0") != 0) (void)::madvise(data_, map_bytes_ - kHuge, MADV_HUGEPAGE);
}

PackedBuffer::~PackedBuffer() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
}

}  // namespace pagoda::kernels
