#include "runtime/kv_storage.h"

#include <sys/mman.h>

#include <cerrno>
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
      if (s.layer_group[i] < 0 || s.layer_slot[i] < 0 || s.layer_slot[i] >= s.n_layer_slots) {
        return errorf("kv storage: layer %d in group %d slot %d of %d", l, s.layer_group[i], s.layer_slot[i],
                      s.n_layer_slots);
      }
    }
  }
  if (s.dtype == KvDtype::Q8_0 && s.kv_dim() % 32 != 0) {
    return errorf("kv storage: q8_0 needs a K/V row (n_kv_heads * head_dim = %lld) that is a multiple of 32",
                  static_cast<long long>(s.kv_dim()));
  }
  uint64_t slots = 0, layer_bytes = 0, total = 0;
  if (!checked_mul(static_cast<uint64_t>(s.num_blocks), static_cast<uint64_t>(s.block_size), &slots) ||
      !checked_mul(slots, s.row_bytes(), &layer_bytes) ||
      !checked_mul(layer_bytes, 2ull * static_cast<uint64_t>(s.slots()), &total) || total > (1ull << 46)) {
    return errorf("kv storage: %d blocks x %d tokens is too large", s.num_blocks, s.block_size);
  }
  void* p = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    return errorf("kv storage: cannot map %llu bytes: %s", static_cast<unsigned long long>(total), std::strerror(errno));
  }
  std::unique_ptr<KvStorage> kv(new KvStorage());
  kv->spec_ = s;
  kv->base_ = static_cast<uint8_t*>(p);
  kv->mapped_bytes_ = total;
  kv->layers_.resize(static_cast<size_t>(s.n_layers));
  for (int32_t l = 0; l < s.n_layers; ++l) {
    kernels::KvLayerView& v = kv->layers_[static_cast<size_t>(l)];
    const bool grouped = !s.layer_slot.empty();
    const auto slot = static_cast<uint64_t>(grouped ? s.layer_slot[static_cast<size_t>(l)] : l);
    v.group = grouped ? s.layer_group[static_cast<size_t>(l)] : 0;
    v.k = kv->base_ + (2 * slot) * layer_bytes;
    v.v = v.k + layer_bytes;
    v.dtype = s.dtype;
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

void KvStorage::copy_block(int32_t src, int32_t dst) {
  PAGODA_CHECK(src >= 0 && src < spec_.num_blocks && dst >= 0 && dst < spec_.num_blocks);
  if (src == dst) return;
  const size_t block_bytes = static_cast<size_t>(spec_.block_size) * spec_.row_bytes();
  const size_t slot_bytes = static_cast<size_t>(spec_.num_blocks) * block_bytes;  // one K or V pool of a layer slot
  for (int32_t i = 0; i < 2 * spec_.slots(); ++i) {  // K and V of every layer slot, whichever group owns the block
    uint8_t* pool = base_ + static_cast<size_t>(i) * slot_bytes;
    std::memcpy(pool + static_cast<size_t>(dst) * block_bytes, pool + static_cast<size_t>(src) * block_bytes, block_bytes);
  }
}

}  // namespace pagoda::runtime

namespace pagoda::runtime {

void KvStorage::export_block(int32_t block, std::string* out) const {
  PAGODA_CHECK(block >= 0 && block < spec_.num_blocks);
  const size_t block_bytes = static_cast<size_t>(spec_.block_size) * spec_.row_bytes();
  const size_t slot_bytes = static_cast<size_t>(spec_.num_blocks) * block_bytes;
  out->resize(2 * static_cast<size_t>(spec_.slots()) * block_bytes);
  for (int32_t i = 0; i < 2 * spec_.slots(); ++i) {
    std::memcpy(out->data() + static_cast<size_t>(i) * block_bytes,
                base_ + static_cast<size_t>(i) * slot_bytes + static_cast<size_t>(block) * block_bytes, block_bytes);
  }
}

void KvStorage::import_block(int32_t block, std::string_view bytes) {
  PAGODA_CHECK(block >= 0 && block < spec_.num_blocks && bytes.size() == this->block_bytes());
  const size_t block_bytes = static_cast<size_t>(spec_.block_size) * spec_.row_bytes();
  const size_t slot_bytes = static_cast<size_t>(spec_.num_blocks) * block_bytes;
  for (int32_t i = 0; i < 2 * spec_.slots(); ++i) {
    std::memcpy(base_ + static_cast<size_t>(i) * slot_bytes + static_cast<size_t>(block) * block_bytes,
                bytes.data() + static_cast<size_t>(i) * block_bytes, block_bytes);
  }
}

}  // namespace pagoda::runtime
