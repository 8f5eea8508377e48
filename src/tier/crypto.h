// Keyed primitives of the tier entries (OpenSSL libcrypto): HMAC-SHA256,
// AES-256-CTR and random bytes. Thin wrappers, so that entry.cc reads as the
// format it is; tests/tier/test_tier_entry.cc checks them against RFC 4231 and
// NIST SP 800-38A vectors.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace pagoda::tier {

using Digest256 = std::array<uint8_t, 32>;

// Incremental HMAC-SHA256 under one key.
class HmacSha256 {
 public:
  explicit HmacSha256(std::string_view key);
  ~HmacSha256();
  HmacSha256(const HmacSha256&) = delete;
  HmacSha256& operator=(const HmacSha256&) = delete;
  void update(const void* data, size_t n);
  void update(std::string_view s) { update(s.data(), s.size()); }
  Digest256 final();

 private:
  void* ctx_ = nullptr;  // EVP_MAC_CTX
};

Digest256 hmac_sha256(std::string_view key, std::string_view data);

// AES-256-CTR of `in` (encrypt and decrypt are the same) into out[0, in.size()).
// `key` is 32 bytes, `iv` the 16-byte initial counter block.
void aes256_ctr(const uint8_t* key, const uint8_t* iv, const char* in, size_t n, char* out);

// n cryptographically random bytes (OpenSSL's RAND_bytes).
void random_bytes(uint8_t* out, size_t n);

// Whether two byte ranges of length n are equal, in time that does not depend on where they differ.
bool equal_constant_time(const void* a, const void* b, size_t n);

}  // namespace pagoda::tier
