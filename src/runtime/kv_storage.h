// KvStorage: the bytes of the KV cache. For every layer slot, a K pool and a V
// pool of num_blocks x block_size slots; slot = block_id * block_size + offset
// holds one token's row of n_kv_heads * head_dim values, K in `dtype.k` and V
// in `dtype.v` (kernels::kv_row_bytes; the two may differ, llama.cpp's -ctk / -ctv). With KV cache groups (kv::KvGroupLayout) there are
// G layer slots, and layer l uses slot layer_slot[l] through the block tables
// of its group layer_group[l]: a block id means G layers of one group, so a
// block costs G layers, whichever group holds it. Without groups, G = n_layers
// and layer l is slot l (group 0).
// Which block belongs to which sequence is kv/'s business (integer ids only);
// this class only owns memory and copies blocks.
//
// Memory is one anonymous mapping: pages are zero and untouched until written,
// so a large reservation costs address space, not RSS, until used.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "kernels/api.h"

namespace pagoda::runtime {

struct KvStorageSpec {
  int32_t n_layers = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t num_blocks = 0;   // including block 0, the kv manager's reserved null block
  int32_t block_size = 16;  // tokens per block
  KvTypes dtype = KvDtype::F32;  // K and V types
  // KV cache groups: G layer slots, and per layer its group and slot. Empty
  // (the default): one group, slot l for layer l, G = n_layers.
  int32_t n_layer_slots = 0;
  std::vector<int32_t> layer_group;  // [n_layers]
  std::vector<int32_t> layer_slot;   // [n_layers]; -1: a recurrent layer (no K/V, a view of null pools)

  int32_t slots() const { return n_layer_slots > 0 ? n_layer_slots : n_layers; }
  int64_t kv_dim() const { return static_cast<int64_t>(n_kv_heads) * head_dim; }
  size_t row_bytes() const { return kernels::kv_row_bytes(dtype.k, kv_dim()); }    // one token, one layer, K
  size_t v_row_bytes() const { return kernels::kv_row_bytes(dtype.v, kv_dim()); }  // one token, one layer, V
  // The mapping's size: per layer slot a K pool [num_blocks * block_size,
  // row_bytes] then a V pool [num_blocks * block_size, v_row_bytes]. How
  // many blocks a budget buys is kv/sizing's arithmetic (the engine's pool), not
  // this layout's; tests/runtime checks the two agree.
  uint64_t bytes_total() const {
    return static_cast<uint64_t>(slots()) * static_cast<uint64_t>(num_blocks) * static_cast<uint64_t>(block_size) *
           (row_bytes() + v_row_bytes());
  }
};

class KvStorage {
 public:
  // Errors: non-positive sizes, a quantized type with a row not a multiple of 32, overflow,
  // or the mapping failing.
  static Expected<std::unique_ptr<KvStorage>> create(const KvStorageSpec& spec);
  ~KvStorage();
  KvStorage(const KvStorage&) = delete;
  KvStorage& operator=(const KvStorage&) = delete;

  const KvStorageSpec& spec() const { return spec_; }
  std::span<const kernels::KvLayerView> layers() const { return layers_; }
  uint64_t bytes_total() const { return spec_.bytes_total(); }

  // Copy-on-write: copies K and V of every layer slot from block src to block dst.
  // Precondition: src, dst in [0, num_blocks).
  void copy_block(int32_t src, int32_t dst);
  // KV tiers (issue 16): the K and V bytes of every layer slot of one block, in
  // slot order (K then V of slot 0, then slot 1, ...); block_bytes() of them.
  uint64_t block_bytes() const {
    return static_cast<uint64_t>(spec_.slots()) * spec_.block_size * (spec_.row_bytes() + spec_.v_row_bytes());
  }
  void export_block(int32_t block, std::string* out) const;
  // Writes bytes made by export_block into `block`. Precondition: size == block_bytes().
  void import_block(int32_t block, std::string_view bytes);

  // Recurrent state (hybrid models, kv/recurrent_state_group.cc): row r of
  // row_bytes of a sequence's state kept in its state blocks, packed as
  // kv/sizing.h's kv_state_rows_per_block says: block by block, in each its
  // layer slots' K chunk then V chunk (the order copy_block and export_block
  // use), floor(chunk / row_bytes) rows per chunk. Rows per block, 0 when a
  // row is larger than a chunk:
  int64_t state_rows_per_block(size_t row_bytes) const;
  // Precondition: r < blocks.size() x state_rows_per_block(row_bytes), blocks in range.
  float* state_row(std::span<const int32_t> blocks, int64_t r, size_t row_bytes) const;

 private:
  KvStorage() = default;
  KvStorageSpec spec_;
  uint8_t* base_ = nullptr;   // [slots(), K pool then V pool of num_blocks * block_size rows]
  // The K (i = 2 * slot) or V (i = 2 * slot + 1) pool i and its bytes per block.
  uint8_t* pool(int32_t i) const;
  size_t pool_block_bytes(int32_t i) const;
  size_t mapped_bytes_ = 0;
  std::vector<kernels::KvLayerView> layers_;  // [n_layers]
};

}  // namespace pagoda::runtime
