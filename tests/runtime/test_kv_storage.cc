#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "runtime/kv_storage.h"
#include "kv/sizing.h"

using namespace pagoda;
using runtime::KvStorage;
using runtime::KvStorageSpec;

namespace {

KvStorageSpec spec(KvDtype dtype, int32_t kv_heads = 2, int32_t head_dim = 32) {
  KvStorageSpec s;
  s.n_layers = 3;
  s.n_kv_heads = kv_heads;
  s.head_dim = head_dim;
  s.num_blocks = 5;
  s.block_size = 4;
  s.dtype = dtype;
  return s;
}

}  // namespace

TEST(KvStorage, BytesPerDtype) {
  struct Case {
    KvDtype dtype;
    size_t row_bytes;
  };
  // kv_dim = 2 heads x 32 = 64 values per token per layer
  for (const Case& c : {Case{KvDtype::F32, 256}, Case{KvDtype::F16, 128},
                        Case{KvDtype::BF16, 128}, Case{KvDtype::Q8_0, 68}}) {
    auto kv = KvStorage::create(spec(c.dtype));
    ASSERT_TRUE(kv.ok()) << kv.message();
    const KvStorageSpec& s = (*kv)->spec();
    EXPECT_EQ(s.row_bytes(), c.row_bytes) << kernels::kv_dtype_name(c.dtype);
    EXPECT_EQ((*kv)->bytes_total(), 2 * 3 * c.row_bytes * 4 * 5);
    // kv/sizing (the engine's pool arithmetic) agrees with this layout.
    kv::KvShape shape;
    shape.num_layers = 3;
    shape.num_kv_heads = 2;
    shape.head_dim = 32;
    EXPECT_EQ(kv::kv_bytes_per_block(shape, kv::kv_dtype_of(c.dtype), 4) * 5, (*kv)->bytes_total());
    EXPECT_EQ(kv::kv_row_bytes(kv::kv_dtype_of(c.dtype), 64), c.row_bytes);
    ASSERT_EQ((*kv)->layers().size(), 3u);
    for (const kernels::KvLayerView& l : (*kv)->layers()) {
      EXPECT_EQ(l.row_bytes, c.row_bytes);
      EXPECT_EQ(l.block_size, 4);
      EXPECT_EQ(l.n_kv_heads, 2);
      EXPECT_EQ(l.head_dim, 32);
      EXPECT_EQ(l.dtype, c.dtype);
    }
  }
  // SmolLM2-135M at 8192 tokens: f16 180 MiB, q8_0 95.625 MiB (30 layers, 3 x 64).
  KvStorageSpec smol;
  smol.n_layers = 30;
  smol.n_kv_heads = 3;
  smol.head_dim = 64;
  smol.num_blocks = 8192;
  smol.block_size = 1;
  smol.dtype = KvDtype::F16;
  EXPECT_EQ(smol.bytes_total(), 180ull << 20);
  smol.dtype = KvDtype::Q8_0;
  EXPECT_EQ(smol.bytes_total(), 100270080ull);
}

// KV cache groups: 6 layers in groups of 2 slots (layer -> group, slot). A
// block holds 2 layer slots; layers of different groups with the same slot
// share the slot's pool (a block id belongs to one group at a time).
TEST(KvStorage, GroupedLayersShareLayerSlots) {
  KvStorageSpec s = spec(KvDtype::F32);
  s.n_layers = 6;
  s.n_layer_slots = 2;
  s.layer_group = {1, 1, 0, 2, 2, 0};
  s.layer_slot = {0, 1, 0, 0, 1, 1};
  auto kv = KvStorage::create(s);
  ASSERT_TRUE(kv.ok()) << kv.message();
  EXPECT_EQ((*kv)->bytes_total(), 2ull * 2 * static_cast<uint64_t>(s.num_blocks) * s.block_size * s.row_bytes());
  const auto layers = (*kv)->layers();
  ASSERT_EQ(layers.size(), 6u);
  EXPECT_EQ(layers[0].k, layers[2].k);  // slot 0
  EXPECT_EQ(layers[0].k, layers[3].k);
  EXPECT_EQ(layers[1].k, layers[5].k);  // slot 1
  EXPECT_NE(layers[0].k, layers[1].k);
  EXPECT_EQ(layers[3].group, 2);
  EXPECT_EQ(layers[5].group, 0);
  // copy_block copies both slots of the block, K and V.
  const size_t block_bytes = static_cast<size_t>(s.block_size) * s.row_bytes();
  for (int i = 0; i < 2; ++i) {
    layers[i].k[block_bytes * 1] = static_cast<uint8_t>(10 + i);
    layers[i].v[block_bytes * 1] = static_cast<uint8_t>(20 + i);
  }
  (*kv)->copy_block(1, 3);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(layers[i].k[block_bytes * 3], 10 + i);
    EXPECT_EQ(layers[i].v[block_bytes * 3], 20 + i);
  }
  KvStorageSpec bad = s;
  bad.layer_slot[2] = 2;  // outside the 2 slots
  EXPECT_FALSE(KvStorage::create(bad).ok());
  bad = s;
  bad.layer_group.pop_back();
  EXPECT_FALSE(KvStorage::create(bad).ok());
}

TEST(KvStorage, RejectsBadSpecs) {
  auto q8 = KvStorage::create(spec(KvDtype::Q8_0, 3, 8));  // kv_dim 24
  ASSERT_FALSE(q8.ok());
  EXPECT_NE(q8.message().find("multiple of 32"), std::string::npos) << q8.message();
  KvStorageSpec s = spec(KvDtype::F32);
  s.num_blocks = 0;
  EXPECT_FALSE(KvStorage::create(s).ok());
  s.num_blocks = 1 << 30;
  s.block_size = 1 << 30;
  EXPECT_FALSE(KvStorage::create(s).ok());
}

TEST(KvStorage, CopyBlockCopiesKAndVOfEveryLayerOnly) {
  auto kv = KvStorage::create(spec(KvDtype::F16));
  ASSERT_TRUE(kv.ok());
  const size_t block_bytes = 4 * (*kv)->spec().row_bytes();
  const size_t pool_bytes = block_bytes * 5;
  // Fill every pool with a pattern that differs per layer, K/V and byte.
  int li = 0;
  for (const kernels::KvLayerView& l : (*kv)->layers()) {
    for (size_t i = 0; i < pool_bytes; ++i) {
      l.k[i] = static_cast<uint8_t>(i * 7 + li * 13 + 1);
      l.v[i] = static_cast<uint8_t>(i * 11 + li * 17 + 2);
    }
    ++li;
  }
  std::vector<std::vector<uint8_t>> before;
  for (const kernels::KvLayerView& l : (*kv)->layers()) {
    before.emplace_back(l.k, l.k + pool_bytes);
    before.emplace_back(l.v, l.v + pool_bytes);
  }
  (*kv)->copy_block(2, 4);
  size_t p = 0;
  for (const kernels::KvLayerView& l : (*kv)->layers()) {
    for (const uint8_t* pool : {l.k, l.v}) {
      const std::vector<uint8_t>& b = before[p++];
      for (size_t i = 0; i < pool_bytes; ++i) {
        const size_t block = i / block_bytes;
        const uint8_t want = block == 4 ? b[2 * block_bytes + i % block_bytes] : b[i];
        ASSERT_EQ(pool[i], want) << "pool " << p - 1 << " byte " << i;
      }
    }
  }
}

// K and V of different types (llama.cpp's -ctk / -ctv): each slot's K pool has
// K's rows, its V pool V's rows; sizes, views, copy-on-write and the tier
// export/import all follow, and kv/sizing agrees with the layout.
TEST(KvStorage, MixedKvTypesHaveTheirOwnRowSizes) {
  KvStorageSpec s = spec(KvDtype::F32);
  s.dtype = KvTypes(KvDtype::Q8_0, KvDtype::Q4_0);
  auto kv = KvStorage::create(s);
  ASSERT_TRUE(kv.ok()) << kv.message();
  EXPECT_EQ(s.row_bytes(), 68u);    // 64 values: 2 x 34
  EXPECT_EQ(s.v_row_bytes(), 36u);  // 2 x 18
  const uint64_t rows = 5 * 4;      // blocks x block size
  EXPECT_EQ((*kv)->bytes_total(), 3 * rows * (68 + 36));
  EXPECT_EQ((*kv)->block_bytes(), 3u * 4 * (68 + 36));
  kv::KvShape shape;
  shape.num_layers = 3;
  shape.num_kv_heads = 2;
  shape.head_dim = 32;
  EXPECT_EQ(kv::kv_bytes_per_block(shape, kv::kv_dtype_of(s.dtype), 4) * 5, (*kv)->bytes_total());
  const auto layers = (*kv)->layers();
  for (size_t l = 0; l < layers.size(); ++l) {
    EXPECT_EQ(layers[l].dtype, KvDtype::Q8_0);
    EXPECT_EQ(layers[l].v_dtype, KvDtype::Q4_0);
    EXPECT_EQ(layers[l].row_bytes, 68u);
    EXPECT_EQ(layers[l].v_row_bytes, 36u);
    EXPECT_EQ(layers[l].v, layers[l].k + rows * 68);
    if (l + 1 < layers.size()) {
      EXPECT_EQ(layers[l + 1].k, layers[l].v + rows * 36);
    }
  }
  // Fill every pool, then copy block 1 to 3 and move block 2 to 4 through export/import.
  for (const kernels::KvLayerView& l : layers) {
    for (size_t i = 0; i < rows * 68; ++i) l.k[i] = static_cast<uint8_t>(i * 7 + 1);
    for (size_t i = 0; i < rows * 36; ++i) l.v[i] = static_cast<uint8_t>(i * 13 + 5);
  }
  (*kv)->copy_block(1, 3);
  std::string bytes;
  (*kv)->export_block(2, &bytes);
  ASSERT_EQ(bytes.size(), (*kv)->block_bytes());
  (*kv)->import_block(4, bytes);
  for (const kernels::KvLayerView& l : layers) {
    EXPECT_EQ(std::memcmp(l.k + 3 * 4 * 68, l.k + 1 * 4 * 68, 4 * 68), 0);
    EXPECT_EQ(std::memcmp(l.v + 3 * 4 * 36, l.v + 1 * 4 * 36, 4 * 36), 0);
    EXPECT_EQ(std::memcmp(l.k + 4 * 4 * 68, l.k + 2 * 4 * 68, 4 * 68), 0);
    EXPECT_EQ(std::memcmp(l.v + 4 * 4 * 36, l.v + 2 * 4 * 36, 4 * 36), 0);
    EXPECT_EQ(l.k[0], 1);  // block 0 untouched
    EXPECT_EQ(l.v[0], 5);
  }
  // A quantized V alone still needs whole 32-value rows, and says which type.
  KvStorageSpec odd = spec(KvDtype::F16, 3, 8);  // kv_dim 24
  odd.dtype = KvTypes(KvDtype::F16, KvDtype::IQ4_NL);
  auto bad = KvStorage::create(odd);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("iq4_nl"), std::string::npos) << bad.message();
}
