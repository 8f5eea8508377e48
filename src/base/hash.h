// Hashing: XXH3 64/128 wrappers.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace pagoda {

struct Hash128 {
  uint64_t lo = 0, hi = 0;
  bool operator==(const Hash128&) const = default;
};

struct Hash128Hasher {
  size_t operator()(const Hash128& h) const { return static_cast<size_t>(h.lo ^ (h.hi * 0x9E3779B97F4A7C15ull)); }
};

uint64_t xxh3_64(const void* data, size_t len, uint64_t seed = 0);
Hash128 xxh3_128(const void* data, size_t len, uint64_t seed = 0);

// Streaming 128-bit hash over several pieces.
class Hasher128 {
 public:
  explicit Hasher128(uint64_t seed = 0);
  ~Hasher128();
  Hasher128(const Hasher128&) = delete;
  Hasher128& operator=(const Hasher128&) = delete;
  void update(const void* data, size_t len);
  Hash128 digest() const;

 private:
  void* state_;
};

}  // namespace pagoda
