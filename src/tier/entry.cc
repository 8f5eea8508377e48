#include "tier/entry.h"

#include <cstdio>
#include <cstring>

namespace pagoda::tier {

namespace {

constexpr uint32_t kMagic = 0x564b4750;  // "PGKV"
constexpr uint32_t kVersion = 1;

// Fixed-size header, written and read with memcpy (native byte order: an entry
// is read by the same build on the same kind of machine; another byte order
// fails the magic check).
struct Header {
  uint32_t magic;
  uint32_t version;
  uint64_t model_fingerprint;
  uint32_t kv_dtype;
  uint32_t block_size;
  uint32_t group;
  uint32_t salt_len;
  uint64_t chain_lo;
  uint64_t chain_hi;
  uint32_t num_tokens;
  uint32_t reserved;
  uint64_t kv_bytes;
};
static_assert(sizeof(Header) == 64);

}  // namespace

std::string TierKey::name() const {
  Hasher128 h(0x7469657273ull);  // "tiers"
  const uint64_t words[6] = {model_fingerprint, kv_dtype, block_size, group, chain.lo, chain.hi};
  h.update(words, sizeof(words));
  const uint64_t salt_len = cache_salt.size();
  h.update(&salt_len, sizeof(salt_len));
  h.update(cache_salt.data(), cache_salt.size());
  const Hash128 d = h.digest();
  char buf[33];
  std::snprintf(buf, sizeof(buf), "%016llx%016llx", static_cast<unsigned long long>(d.hi),
                static_cast<unsigned long long>(d.lo));
  return buf;
}

std::string encode_entry(const TierKey& key, std::span<const int32_t> tokens, std::string_view kv_bytes) {
  Header h{};
  h.magic = kMagic;
  h.version = kVersion;
  h.model_fingerprint = key.model_fingerprint;
  h.kv_dtype = key.kv_dtype;
  h.block_size = key.block_size;
  h.group = key.group;
  h.salt_len = static_cast<uint32_t>(key.cache_salt.size());
  h.chain_lo = key.chain.lo;
  h.chain_hi = key.chain.hi;
  h.num_tokens = static_cast<uint32_t>(tokens.size());
  h.kv_bytes = kv_bytes.size();
  std::string out;
  out.reserve(sizeof(h) + key.cache_salt.size() + tokens.size_bytes() + kv_bytes.size() + sizeof(uint64_t));
  out.append(reinterpret_cast<const char*>(&h), sizeof(h));
  out.append(key.cache_salt);
  out.append(reinterpret_cast<const char*>(tokens.data()), tokens.size_bytes());
  out.append(kv_bytes);
  const uint64_t sum = xxh3_64(out.data(), out.size());
  out.append(reinterpret_cast<const char*>(&sum), sizeof(sum));
  return out;
}

const char* decode_result_name(DecodeResult r) {
  switch (r) {
    case DecodeResult::kOk: return "ok";
    case DecodeResult::kCorrupt: return "corrupt";
    case DecodeResult::kMismatch: return "mismatch";
  }
  return "?";
}

DecodeResult decode_entry(std::string_view blob, const TierKey& key, std::span<const int32_t> tokens,
                          uint64_t kv_bytes_expected, std::string* kv_bytes) {
  Header h{};
  if (blob.size() < sizeof(h) + sizeof(uint64_t)) return DecodeResult::kCorrupt;
  std::memcpy(&h, blob.data(), sizeof(h));
  if (h.magic != kMagic || h.version != kVersion) return DecodeResult::kCorrupt;
  // The lengths must add up to the size exactly (a torn file is shorter).
  const uint64_t body = uint64_t{h.salt_len} + uint64_t{h.num_tokens} * sizeof(int32_t) + h.kv_bytes;
  if (h.kv_bytes > blob.size() || body + sizeof(h) + sizeof(uint64_t) != blob.size()) return DecodeResult::kCorrupt;
  uint64_t sum = 0;
  std::memcpy(&sum, blob.data() + blob.size() - sizeof(sum), sizeof(sum));
  if (sum != xxh3_64(blob.data(), blob.size() - sizeof(sum))) return DecodeResult::kCorrupt;
  const char* p = blob.data() + sizeof(h);
  const std::string_view salt(p, h.salt_len);
  p += h.salt_len;
  if (h.model_fingerprint != key.model_fingerprint || h.kv_dtype != key.kv_dtype ||
      h.block_size != key.block_size || h.group != key.group || h.chain_lo != key.chain.lo ||
      h.chain_hi != key.chain.hi || salt != key.cache_salt || h.num_tokens != tokens.size() ||
      h.kv_bytes != kv_bytes_expected || (!tokens.empty() && std::memcmp(p, tokens.data(), tokens.size_bytes()) != 0)) {
    return DecodeResult::kMismatch;
  }
  p += tokens.size_bytes();
  kv_bytes->assign(p, h.kv_bytes);
  return DecodeResult::kOk;
}

}  // namespace pagoda::tier
