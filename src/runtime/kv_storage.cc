#include "runtime/kv_storage.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "base/check.h"
#include "base/checked_math.h"

namespace pagoda::runtime {

Expected<std::unique_ptr<KvStorage>> KvStorage::create(const KvStorageSpec& s) {
  if (s.n_layers <= 0 || s.n_kv_heads <= 0 || s.head_dim <= 0 || s.num_blocks <= 0 || s.block_size <= 0) {
    return errorf("kv storage: layers %d, kv heads %d, head dim %d, blocks %d, block size %d must all be positive",
                  s.n_layers, s.n_kv_heads, s.head_dim, s.num_blocks, s.block_size);
  }
  if (!s.layer_group.empty() || !s.layer_slot.empty() || s.n_layer_slots != 0) {
    if (s.layer_group.size() != static_cast<size_t>(s.n_layers) || s.layer_slot.size() != static_cast<size_t>(s.n_layers) ||
        s.n_layer_slots <= 0 || s.n_layer_slots > s.n_layers) {
      return errorf("kv storage: %zu layer groups and %zu layer slots (of %d) for %d layers", s.layer_group.size(),
                    s.layer_slot.size(), s.n_layer_slots, s.n_layers);
    }
    for (int32_t l = 0; l < s.n_layers; ++l) {
      const auto i = static_cast<size_t>(l);
      if (s.layer_group[i] < 0 || s.layer_slot[i] < -1 || s.layer_slot[i] >= s.n_layer_slots) {
        return errorf("kv storage: layer %d in group %d slot %d of %d", l, s.layer_group[i], s.layer_slot[i],
                      s.n_layer_slots);
      }
    }
  }
  for (KvDtype d : {s.dtype.k, s.dtype.v}) {
    if (kv_dtype_is_quantized(d) && s.kv_dim() % 32 != 0) {
      return errorf("kv storage: %s needs a K/V row (n_kv_heads * head_dim = %lld) that is a multiple of 32",
                    kv_dtype_name(d), static_cast<long long>(s.kv_dim()));
    }
  }
  uint64_t slots = 0, layer_bytes = 0, total = 0;
  if (!checked_mul(static_cast<uint64_t>(s.num_blocks), static_cast<uint64_t>(s.block_size), &slots) ||
      !checked_mul(slots, s.row_bytes() + s.v_row_bytes(), &layer_bytes) ||
      !checked_mul(layer_bytes, static_cast<uint64_t>(s.slots()), &total) || total > (1ull << 46)) {
    return errorf("kv storage: %d blocks x %d tokens is too large", s.num_blocks, s.block_size);
  }
  void* p = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    return errorf("kv storage: cannot map %llu bytes: %s", static_cast<unsigned long long>(total), std::strerror(errno));
  }
  // Transparent huge pages, advice only (THP off: plain 4 KiB pages). Decode
  // attention reads a KV head's slice of every row of scattered 16-row pages:
  // with 4 KiB pages a sequence at depth 16384 touches more pages per layer
  // than the second-level TLB holds (Intel Xeon, bench_attention_decode 1 16384
  // ... huge=1: 8.3 against 7.4 GB/s). env PAGODA_KV_THP=0 leaves them off.
  const char* thp = std::getenv("PAGODA_KV_THP");
  if (thp == nullptr || std::strcmp(thp, "0") != 0) (void)madvise(p, total, MADV_HUGEPAGE);
  std::unique_ptr<KvStorage> kv(new KvStorage());
  kv->spec_ = s;
  kv->base_ = static_cast<uint8_t*>(p);
  kv->mapped_bytes_ = total;
  kv->layers_.resize(static_cast<size_t>(s.n_layers));
  for (int32_t l = 0; l < s.n_layers; ++l) {
    kernels::KvLayerView& v = kv->layers_[static_cast<size_t>(l)];
    const bool grouped = !s.layer_slot.empty();
    if (grouped && s.layer_slot[static_cast<size_t>(l)] < 0) {  // recurrent: its state is not in a layer slot
      v.group = s.layer_group[static_cast<size_t>(l)];
      continue;
    }
    const auto slot = static_cast<uint64_t>(grouped ? s.layer_slot[static_cast<size_t>(l)] : l);
    v.group = grouped ? s.layer_group[static_cast<size_t>(l)] : 0;
    v.k = kv->base_ + slot * layer_bytes;
    v.v = v.k + slots * s.row_bytes();
    v.dtype = s.dtype.k;
    v.v_dtype = s.dtype.v;
    v.v_row_bytes = s.v_row_bytes();
    v.block_size = s.block_size;
    v.n_kv_heads = s.n_kv_heads;
    v.head_dim = s.head_dim;
    v.row_bytes = s.row_bytes();
  }
  return kv;
}

KvStorage::~KvStorage() {
  if (base_) munmap(base_, mapped_bytes_);
}

uint8_t* KvStorage::pool(int32_t i) const {
  const uint64_t rows = static_cast<uint64_t>(spec_.num_blocks) * static_cast<uint64_t>(spec_.block_size);
  return base_ + static_cast<size_t>(i / 2) * rows * (spec_.row_bytes() + spec_.v_row_bytes()) +
         (i % 2 == 1 ? rows * spec_.row_bytes() : 0);
}

size_t KvStorage::pool_block_bytes(int32_t i) const {
  return static_cast<size_t>(spec_.block_size) * (i % 2 == 0 ? spec_.row_bytes() : spec_.v_row_bytes());
}

void KvStorage::copy_block(int32_t src, int32_t dst) {
  PAGODA_CHECK(src >= 0 && src < spec_.num_blocks && dst >= 0 && dst < spec_.num_blocks);
  if (src == dst) return;
  for (int32_t i = 0; i < 2 * spec_.slots(); ++i) {  // K and V of every layer slot, whichever group owns the block
    const size_t bb = pool_block_bytes(i);
    uint8_t* p = pool(i);
    std::memcpy(p + static_cast<size_t>(dst) * bb, p + static_cast<size_t>(src) * bb, bb);
  }
}

}  // namespace pagoda::runtime

namespace pagoda::runtime {

void KvStorage::export_block(int32_t block, std::string* out) const {
  PAGODA_CHECK(block >= 0 && block < spec_.num_blocks);
  out->resize(this->block_bytes());
  size_t at = 0;
  for (int32_t i = 0; i < 2 * spec_.slots(); ++i) {
    const size_t bb = pool_block_bytes(i);
    std::memcpy(out->data() + at, pool(i) + static_cast<size_t>(block) * bb, bb);
    at += bb;
  }
}

void KvStorage::import_block(int32_t block, std::string_view bytes) {
  PAGODA_CHECK(block >= 0 && block < spec_.num_blocks && bytes.size() == this->block_bytes());
  size_t at = 0;
  for (int32_t i = 0; i < 2 * spec_.slots(); ++i) {
    const size_t bb = pool_block_bytes(i);
    std::memcpy(pool(i) + static_cast<size_t>(block) * bb, bytes.data() + at, bb);
    at += bb;
  }
}

}  // namespace pagoda::runtime

namespace pagoda::runtime {

int64_t KvStorage::state_rows_per_block(size_t row_bytes) const {
  if (row_bytes == 0) return 0;
  const size_t bs = static_cast<size_t>(spec_.block_size);
  return static_cast<int64_t>(spec_.slots()) *
         static_cast<int64_t>(bs * spec_.row_bytes() / row_bytes + bs * spec_.v_row_bytes() / row_bytes);
}

float* KvStorage::state_row(std::span<const int32_t> blocks, int64_t r, size_t row_bytes) const {
  const size_t bs = static_cast<size_t>(spec_.block_size);
  const int64_t rk = static_cast<int64_t>(bs * spec_.row_bytes() / row_bytes);
  const int64_t rv = static_cast<int64_t>(bs * spec_.v_row_bytes() / row_bytes);
  const int64_t per_block = static_cast<int64_t>(spec_.slots()) * (rk + rv);
  PAGODA_CHECK(per_block > 0 && r >= 0 && r / per_block < static_cast<int64_t>(blocks.size()));
  const int32_t block = blocks[static_cast<size_t>(r / per_block)];
  PAGODA_CHECK(block > 0 && block < spec_.num_blocks);
  const int64_t in_block = r % per_block;
  const auto slot = static_cast<int32_t>(in_block / (rk + rv));
  const int64_t in_slot = in_block % (rk + rv);
  const int32_t i = in_slot < rk ? 2 * slot : 2 * slot + 1;  // K chunk, then V chunk
  const int64_t row = in_slot < rk ? in_slot : in_slot - rk;
  uint8_t* p = pool(i) + static_cast<size_t>(block) * pool_block_bytes(i) + static_cast<size_t>(row) * row_bytes;
  return reinterpret_cast<float*>(p);
}

}  // namespace pagoda::runtime
