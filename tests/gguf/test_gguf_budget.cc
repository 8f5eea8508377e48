// The loader bounds parsed metadata by its in-memory cost, not by element count:
// a small file of u8 arrays must not make it allocate a Value (~100 bytes) per byte.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "gguf/gguf.h"

using namespace pagoda::gguf;

namespace {
template <typename T>
void put(std::vector<uint8_t>* b, T v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  b->insert(b->end(), p, p + sizeof(T));
}
void put_str(std::vector<uint8_t>* b, const std::string& s) {
  put<uint64_t>(b, s.size());
  b->insert(b->end(), s.begin(), s.end());
}
// A GGUF v3 file with no tensors and `arrays` metadata keys, each a u8 array of n elements.
std::vector<uint8_t> u8_arrays(int arrays, uint64_t n) {
  std::vector<uint8_t> b;
  b.reserve(64 + static_cast<size_t>(arrays) * (n + 64));
  for (char c : std::string("GGUF")) b.push_back(static_cast<uint8_t>(c));
  put<uint32_t>(&b, 3);
  put<uint64_t>(&b, 0);
  put<uint64_t>(&b, static_cast<uint64_t>(arrays));
  for (int a = 0; a < arrays; ++a) {
    put_str(&b, "test.bytes" + std::to_string(a));
    put<uint32_t>(&b, static_cast<uint32_t>(ValueType::ARRAY));
    put<uint32_t>(&b, static_cast<uint32_t>(ValueType::UINT8));
    put<uint64_t>(&b, n);
    b.resize(b.size() + n, 7);
  }
  b.resize((b.size() + 31) / 32 * 32, 0);  // data section alignment
  return b;
}
}  // namespace

TEST(GgufBudget, SmallFileOfByteArraysIsRefusedByMemoryCost) {
  // 4 MiB of file; as Values it would be 4M x sizeof(Value) (~400 MB), past the budget.
  auto bytes = u8_arrays(4, 1u << 20);
  auto f = GgufFile::from_memory(bytes.data(), bytes.size());
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.message().find("MiB of values"), std::string::npos) << f.message();
}

TEST(GgufBudget, RealisticArraysStillLoad) {
  // 300k elements (~30 MB of Values): the size of a large vocabulary's arrays.
  auto bytes = u8_arrays(3, 100000);
  auto f = GgufFile::from_memory(bytes.data(), bytes.size());
  ASSERT_TRUE(f.ok()) << f.message();
  const Value* v = (*f)->find("test.bytes2");
  ASSERT_NE(v, nullptr);
  ASSERT_EQ(v->arr.size(), 100000u);
  EXPECT_EQ(v->arr[99999].u64, 7u);
}
