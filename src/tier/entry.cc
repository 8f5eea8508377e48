#include "tier/entry.h"

#include <cstdio>
#include <cstring>

#include "tier/crypto.h"

namespace pagoda::tier {

namespace {

constexpr uint32_t kMagic = 0x564b4750;  // "PGKV"
constexpr uint32_t kVersion = 2;         // 1: salt and tokens in plain form, an XXH3-64 checksum

// Fixed-size header, written and read with memcpy (native byte order: an entry
// is read by the same build on the same kind of machine; another byte order
// fails the magic check).
struct Header {
  uint32_t magic;
  uint32_t version;
  uint64_t kv_bytes;
  uint8_t iv[16];  // AES-256-CTR's initial counter block, random per entry
};
static_assert(sizeof(Header) == 32);
constexpr size_t kTagBytes = 32;

// The key fields, in one fixed layout (the name's and the MAC's input).
void hash_key(HmacSha256& h, const TierKey& key) {
  const uint64_t words[7] = {key.model_fingerprint, key.kv_dtype, key.block_size, key.group,
                             key.chain.lo,          key.chain.hi, key.cache_salt.size()};
  h.update(words, sizeof(words));
  h.update(key.cache_salt);
}

Digest256 entry_mac(const std::array<uint8_t, 32>& mac_key, const TierKey& key, std::span<const int32_t> tokens,
                    std::string_view header_and_ciphertext) {
  HmacSha256 h(std::string_view(reinterpret_cast<const char*>(mac_key.data()), mac_key.size()));
  h.update("pagoda kv entry v2");
  hash_key(h, key);
  const uint64_t n = tokens.size();
  h.update(&n, sizeof(n));
  h.update(tokens.data(), tokens.size_bytes());
  h.update(header_and_ciphertext);
  return h.final();
}

}  // namespace

EntryCodec::EntryCodec(std::string_view secret) {
  name_key_ = hmac_sha256(secret, "pagoda kv tier: entry names");
  mac_key_ = hmac_sha256(secret, "pagoda kv tier: entry MACs");
  enc_key_ = hmac_sha256(secret, "pagoda kv tier: K/V encryption");
}

std::string EntryCodec::name(const TierKey& key) const {
  HmacSha256 h(std::string_view(reinterpret_cast<const char*>(name_key_.data()), name_key_.size()));
  hash_key(h, key);
  const Digest256 d = h.final();
  static const char kHex[] = "0123456789abcdef";
  std::string out(32, '0');
  for (size_t i = 0; i < 16; ++i) {
    out[2 * i] = kHex[d[i] >> 4];
    out[2 * i + 1] = kHex[d[i] & 15];
  }
  return out;
}

uint64_t EntryCodec::entry_size(uint64_t kv_bytes) { return sizeof(Header) + kv_bytes + kTagBytes; }

std::string EntryCodec::encode(const TierKey& key, std::span<const int32_t> tokens, std::string_view kv_bytes) const {
  Header h{};
  h.magic = kMagic;
  h.version = kVersion;
  h.kv_bytes = kv_bytes.size();
  random_bytes(h.iv, sizeof(h.iv));
  std::string out(entry_size(kv_bytes.size()), '\0');
  std::memcpy(out.data(), &h, sizeof(h));
  aes256_ctr(enc_key_.data(), h.iv, kv_bytes.data(), kv_bytes.size(), out.data() + sizeof(h));
  const Digest256 tag =
      entry_mac(mac_key_, key, tokens, std::string_view(out.data(), sizeof(h) + kv_bytes.size()));
  std::memcpy(out.data() + sizeof(h) + kv_bytes.size(), tag.data(), tag.size());
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

DecodeResult EntryCodec::decode(std::string_view blob, const TierKey& key, std::span<const int32_t> tokens,
                                uint64_t kv_bytes_expected, std::string* kv_bytes) const {
  kv_bytes->clear();
  Header h{};
  if (blob.size() < 2 * sizeof(uint32_t)) return DecodeResult::kCorrupt;
  std::memcpy(&h, blob.data(), 2 * sizeof(uint32_t));
  if (h.magic != kMagic) return DecodeResult::kCorrupt;
  if (h.version != kVersion) return DecodeResult::kMismatch;  // another format: not ours to read or drop
  // The key implies the size exactly (a torn entry is shorter).
  if (blob.size() != entry_size(kv_bytes_expected)) return DecodeResult::kCorrupt;
  std::memcpy(&h, blob.data(), sizeof(h));
  if (h.kv_bytes != kv_bytes_expected) return DecodeResult::kCorrupt;
  const size_t body = sizeof(h) + kv_bytes_expected;
  const Digest256 tag = entry_mac(mac_key_, key, tokens, blob.substr(0, body));
  if (!equal_constant_time(tag.data(), blob.data() + body, tag.size())) return DecodeResult::kCorrupt;
  kv_bytes->resize(kv_bytes_expected);
  aes256_ctr(enc_key_.data(), h.iv, blob.data() + sizeof(h), kv_bytes_expected, kv_bytes->data());
  return DecodeResult::kOk;
}

}  // namespace pagoda::tier
