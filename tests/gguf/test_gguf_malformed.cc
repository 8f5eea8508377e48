// A corpus of malformed GGUF files, built byte by byte here (independently of
// the writer). Each must be rejected with an error naming the field; none may
// crash, abort or allocate hugely (ASan/UBSan builds run this too).
#include <gtest/gtest.h>

#include <cstring>
#include <functional>

#include "base/rng.h"
#include "gguf/gguf.h"

namespace pagoda::gguf {
namespace {

constexpr uint64_t k2p63 = 1ull << 63;

// Little-endian byte builder.
struct Bytes {
  std::vector<uint8_t> b;
  Bytes& raw(const void* p, size_t n) {
    const auto* c = static_cast<const uint8_t*>(p);
    b.insert(b.end(), c, c + n);
    return *this;
  }
  Bytes& u8(uint8_t v) { return raw(&v, 1); }
  Bytes& u32(uint32_t v) { return raw(&v, 4); }
  Bytes& u64(uint64_t v) { return raw(&v, 8); }
  Bytes& f32(float v) { return raw(&v, 4); }
  Bytes& str(const std::string& s) { return u64(s.size()).raw(s.data(), s.size()); }
  Bytes& pad_to(size_t a) {
    while (b.size() % a) b.push_back(0);
    return *this;
  }
};

struct TensorSpec {
  std::string name;
  std::vector<uint64_t> dims;
  uint32_t type;
  uint64_t offset;
};

// Parts of a file that a case may replace.
struct Spec {
  uint32_t version = 3;
  std::function<void(Bytes&)> kv = [](Bytes& b) {  // 2 pairs
    b.str("general.architecture").u32(8).str("llama");
    b.str("some.ints").u32(9).u32(4).u64(3).u32(1).u32(2).u32(3);
  };
  uint64_t n_kv = 2;
  std::vector<TensorSpec> tensors = {{"a.weight", {8}, 0, 0}, {"blk.3.attn_q.weight", {32, 2}, 8, 32}};
  uint64_t n_tensors_override = ~0ull;
  size_t alignment = 32;
  size_t data_bytes = 32 + 68;  // F32[8] padded to 32 + Q8_0 [32 x 2]
};

std::vector<uint8_t> build(const Spec& s) {
  Bytes b;
  b.raw("GGUF", 4).u32(s.version);
  b.u64(s.n_tensors_override != ~0ull ? s.n_tensors_override : s.tensors.size()).u64(s.n_kv);
  s.kv(b);
  for (const auto& t : s.tensors) {
    b.str(t.name).u32(static_cast<uint32_t>(t.dims.size()));
    for (uint64_t d : t.dims) b.u64(d);
    b.u32(t.type).u64(t.offset);
  }
  b.pad_to(s.alignment);
  for (size_t i = 0; i < s.data_bytes; ++i) b.u8(static_cast<uint8_t>(i));
  return b.b;
}

std::string parse_error(const std::vector<uint8_t>& bytes) {
  auto f = GgufFile::from_memory(bytes.data(), bytes.size());
  if (f.ok()) return "";
  EXPECT_FALSE(f.message().empty());
  return f.message();
}

TEST(GgufMalformed, BaselineIsValid) {
  auto bytes = build(Spec{});
  auto f = GgufFile::from_memory(bytes.data(), bytes.size());
  ASSERT_TRUE(f.ok()) << f.message();
  EXPECT_EQ((*f)->tensors().size(), 2u);
  EXPECT_EQ((*f)->get_int_array("some.ints").value(), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ((*f)->data_size(), 100u);
  // Touch every byte of every tensor (ASan checks the bounds).
  unsigned sum = 0;
  for (const auto& t : (*f)->tensors())
    for (uint64_t i = 0; i < t.n_bytes; ++i) sum += t.data[i];
  EXPECT_GT(sum, 0u);
}

struct Case {
  const char* what;
  std::function<std::vector<uint8_t>()> make;
  const char* expect;  // substring of the error
};

std::vector<Case> corpus() {
  auto with = [](std::function<void(Spec&)> edit) {
    return [edit]() {
      Spec s;
      edit(s);
      return build(s);
    };
  };
  auto tensor0 = [with](TensorSpec t) {
    return with([t](Spec& s) { s.tensors[0] = t; });
  };
  auto kv_only = [with](std::function<void(Bytes&)> kv) {
    return with([kv](Spec& s) {
      s.kv = kv;
      s.n_kv = 1;
    });
  };
  std::vector<Case> c = {
      {"empty file", [] { return std::vector<uint8_t>{}; }, "too small for the GGUF magic"},
      {"bad magic", [] { auto b = build(Spec{}); b[0] = 'X'; return b; }, "bad magic"},
      {"version 1", with([](Spec& s) { s.version = 1; }), "version 1 is not supported"},
      {"version 4", with([](Spec& s) { s.version = 4; }), "version 4 is not supported"},
      {"big-endian", with([](Spec& s) { s.version = 3u << 24; }), "big-endian"},
      {"header truncated", [] { auto b = build(Spec{}); b.resize(12); return b; }, "tensor count at offset 8"},
      {"tensor count 2^63", with([](Spec& s) { s.n_tensors_override = k2p63; }), "tensor count 9223372036854775808"},
      {"kv count 2^63", with([](Spec& s) { s.n_kv = k2p63; }), "metadata count 9223372036854775808"},
      {"tensor count one too many", with([](Spec& s) { s.n_tensors_override = 3; }), "tensor"},
      {"key length past end", kv_only([](Bytes& b) { b.u64(1ull << 40); }), "metadata key length 1099511627776"},
      {"key length 2^63", kv_only([](Bytes& b) { b.u64(k2p63); }), "metadata key length 9223372036854775808"},
      {"unknown value type", kv_only([](Bytes& b) { b.str("k").u32(13).u32(0); }), "value type 13"},
      {"string value past end", kv_only([](Bytes& b) { b.str("k").u32(8).u64(5000); }), "string value length 5000"},
      {"array length 2^63", kv_only([](Bytes& b) { b.str("k").u32(9).u32(0).u64(k2p63); }),
       "array length 9223372036854775808"},
      {"array of u32 past end", kv_only([](Bytes& b) { b.str("k").u32(9).u32(4).u64(1000).u32(1); }),
       "array length 1000"},
      {"array of strings 2^62", kv_only([](Bytes& b) { b.str("k").u32(9).u32(8).u64(1ull << 62); }),
       "array length 4611686018427387904"},
      {"string inside array past end",
       kv_only([](Bytes& b) { b.str("tokens").u32(9).u32(8).u64(2).str("ok").u64(999999); }),
       "array element 1 of 2: string value length 999999"},
      {"unknown array element type", kv_only([](Bytes& b) { b.str("k").u32(9).u32(77).u64(0); }),
       "array element type 77"},
      {"arrays nested too deep",
       kv_only([](Bytes& b) {
         b.str("deep").u32(9);
         for (int i = 0; i < 5; ++i) b.u32(9).u64(1);
         b.u32(0).u64(0);
       }),
       "nesting depth 5"},
      {"duplicate key", with([](Spec& s) {
         s.kv = [](Bytes& b) { b.str("k").u32(4).u32(1).str("k").u32(4).u32(2); };
       }), "metadata key 'k' appears twice"},
      {"alignment 0", kv_only([](Bytes& b) { b.str("general.alignment").u32(4).u32(0); }),
       "general.alignment 0 is not a power of two"},
      {"alignment 48", kv_only([](Bytes& b) { b.str("general.alignment").u32(4).u32(48); }),
       "general.alignment 48 is not a power of two"},
      {"alignment as string", kv_only([](Bytes& b) { b.str("general.alignment").u32(8).str("32"); }),
       "general.alignment has type string"},
      {"tensor name past end", with([](Spec& s) {
         s.tensors.clear();
         s.n_tensors_override = 1;
         s.n_kv = 1;
         s.data_bytes = 40;
         s.kv = [](Bytes& b) { b.str("k").u32(4).u32(1).u64(100000); };  // the "name length"
       }), "tensor name length 100000"},
      {"n_dims 0", tensor0({"a.weight", {}, 0, 0}), "tensor 'a.weight': n_dims 0 is out of range 1..4"},
      {"n_dims 5", tensor0({"a.weight", {1, 1, 1, 1, 1}, 0, 0}), "n_dims 5 is out of range"},
      {"dimension 2^63", tensor0({"a.weight", {k2p63}, 0, 0}), "dimension 0 = 9223372036854775808"},
      {"element count overflow", tensor0({"a.weight", {1ull << 32, 1ull << 32}, 0, 0}), "element count overflows"},
      {"byte size overflow", tensor0({"a.weight", {1ull << 31, 1ull << 31}, 0, 0}), "byte size overflows"},
      {"unknown type id", tensor0({"a.weight", {8}, 99, 0}), "unknown ggml type id 99"},
      {"removed type id 4", tensor0({"a.weight", {8}, 4, 0}), "unknown ggml type id 4"},
      {"unsupported type", tensor0({"a.weight", {256}, 15, 0}), "Q8_K (id 15) is not supported"},
      {"row not a block multiple", tensor0({"a.weight", {33}, 8, 0}),
       "row length 33 is not a multiple of the Q8_0 block size 32"},
      {"misaligned offset", tensor0({"a.weight", {8}, 0, 4}), "offset 4 is not a multiple of the alignment 32"},
      {"offset past end", tensor0({"a.weight", {8}, 0, 1ull << 40}), "runs past end of data"},
      {"offset near 2^64", tensor0({"a.weight", {8}, 0, ~0ull - 31}), "runs past end of data"},
      {"size past end", tensor0({"a.weight", {64}, 0, 64}), "tensor a.weight: offset 64 + size 256 runs past end of data (100 bytes)"},
      {"overlapping tensors", tensor0({"a.weight", {16}, 0, 32}), "overlaps"},
      {"contained tensor", with([](Spec& s) {
         s.tensors = {{"big", {24}, 0, 0}, {"mid", {8}, 0, 32}, {"small", {1}, 0, 64}};
       }), "tensor big (offset 0, size 96) overlaps tensor mid"},
      {"duplicate tensor name", tensor0({"blk.3.attn_q.weight", {8}, 0, 0}),
       "tensor 'blk.3.attn_q.weight' appears twice"},
      {"data section truncated", with([](Spec& s) { s.data_bytes = 50; }),
       "tensor blk.3.attn_q.weight: offset 32 + size 68 runs past end of data (50 bytes)"},
      {"no data section", with([](Spec& s) { s.data_bytes = 0; }), "runs past end of data (0 bytes)"},
  };
  return c;
}

TEST(GgufMalformed, CorpusIsRejectedWithNamedField) {
  const auto cases = corpus();
  EXPECT_GE(cases.size(), 25u);
  for (const auto& c : cases) {
    const std::string err = parse_error(c.make());
    EXPECT_NE(err, "") << c.what << ": accepted";
    EXPECT_NE(err.find(c.expect), std::string::npos) << c.what << ": got \"" << err << "\", want \"" << c.expect << "\"";
  }
}

TEST(GgufMalformed, TruncatedAtEveryByte) {
  const auto full = build(Spec{});
  // Every prefix that cuts into the header, the metadata, the tensor infos or
  // the last tensor's bytes must fail (only the trailing padding is optional).
  const size_t last_byte = full.size() - 100 + 32 + 68;
  for (size_t n = 0; n < last_byte; ++n) {
    std::vector<uint8_t> prefix(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_NE(parse_error(prefix), "") << "prefix of " << n << " bytes accepted";
  }
  std::vector<uint8_t> exact(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(last_byte));
  EXPECT_EQ(parse_error(exact), "");
}

TEST(GgufMalformed, RandomMutationsNeverCrash) {
  const auto base = build(Spec{});
  Rng rng(7);
  int rejected = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    auto b = base;
    const int flips = 1 + static_cast<int>(rng.uniform_int(0, 3));
    for (int k = 0; k < flips; ++k) {
      const size_t at = static_cast<size_t>(rng.uniform_int(0, static_cast<int64_t>(b.size()) - 1));
      if (rng.uniform() < 0.5) b[at] = static_cast<uint8_t>(rng.next_u64());
      else b[at] ^= static_cast<uint8_t>(1u << rng.uniform_int(0, 7));
    }
    auto f = GgufFile::from_memory(b.data(), b.size());
    if (!f.ok()) {
      ++rejected;
      continue;
    }
    unsigned sum = 0;
    for (const auto& t : (*f)->tensors())
      for (uint64_t i = 0; i < t.n_bytes; ++i) sum += t.data[i];
    (void)sum;
  }
  EXPECT_GT(rejected, 100);  // mutations in the header region must be caught
}

TEST(GgufMalformed, NullAndTinyBuffers) {
  EXPECT_NE(parse_error({}), "");
  auto f = GgufFile::from_memory(nullptr, 100);
  EXPECT_FALSE(f.ok());
  EXPECT_NE(parse_error({'G', 'G', 'U', 'F'}), "");
}

}  // namespace
}  // namespace pagoda::gguf
