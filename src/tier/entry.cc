#include "tier/entry.h"

#include <cstddef>
#include <cstdio>
#include <cstring>

#include "tier/crypto.h"

namespace pagoda::tier {

namespace {

constexpr uint32_t kMagic = 0x564b4750;  // "PGKV"
constexpr uint32_t kVersion = 3;         // 1: salt and tokens in plain form; 2: no expiry, namespace or meta

// Fixed-size header, written and read with memcpy (native byte order: an entry
// is read by the same build on the same kind of machine; another byte order
// fails the magic check). Then: the meta (encrypted), its MAC, the K/V
// (encrypted), the entry's MAC.
struct Header {
  uint32_t magic;
  uint32_t version;
  uint64_t kv_bytes;
  uint64_t expiry_ms;   // at kExpiryOffset; outside both MACs (entry.h)
  uint64_t ns;          // namespace_tag
  uint32_t meta_bytes;  // the meta's plain length (meta_size)
  uint32_t reserved;
  uint8_t iv[16];       // AES-256-CTR's initial counter block of the K/V, random per entry
  uint8_t meta_iv[16];  // and of the meta
};
static_assert(sizeof(Header) == 72 && offsetof(Header, expiry_ms) == EntryCodec::kExpiryOffset);
constexpr size_t kTagBytes = 32;

// chain (16), parent (16), group (4), flags (4: bit 0 root, bit 1 a checkpoint), then the token ids.
size_t meta_size(size_t num_tokens) { return 40 + 4 * num_tokens; }

// The key fields, in one fixed layout (the name's and the MAC's input).
void hash_key(HmacSha256& h, const TierKey& key) {
  const uint64_t words[7] = {key.model_fingerprint, key.kv_dtype, key.block_size, key.group,
                             key.chain.lo,          key.chain.hi, key.cache_salt.size()};
  h.update(words, sizeof(words));
  // Another kind adds a word: the input is then 8 bytes longer for the same
  // salt size (words[6]), so it can never equal a block key's.
  if (key.kind != TierKey::kBlock) {
    const uint64_t kind = key.kind;
    h.update(&kind, sizeof(kind));
  }
  h.update(key.cache_salt);
}

// `bytes` with the header's expiry read as zeros (it is outside the MACs).
void update_without_expiry(HmacSha256& h, std::string_view bytes) {
  static const char kZero[8] = {};
  h.update(bytes.substr(0, EntryCodec::kExpiryOffset));
  h.update(kZero, sizeof(kZero));
  h.update(bytes.substr(EntryCodec::kExpiryOffset + 8));
}

Digest256 entry_mac(const std::array<uint8_t, 32>& mac_key, const TierKey& key, std::span<const int32_t> tokens,
                    std::string_view body) {
  HmacSha256 h(std::string_view(reinterpret_cast<const char*>(mac_key.data()), mac_key.size()));
  h.update("pagoda kv entry v3");
  hash_key(h, key);
  const uint64_t n = tokens.size();
  h.update(&n, sizeof(n));
  h.update(tokens.data(), tokens.size_bytes());
  update_without_expiry(h, body);
  return h.final();
}

// The meta's MAC: bound to the entry's name, readable without the key.
Digest256 meta_mac(const std::array<uint8_t, 32>& mac_key, std::string_view name, std::string_view header_and_meta) {
  HmacSha256 h(std::string_view(reinterpret_cast<const char*>(mac_key.data()), mac_key.size()));
  h.update("pagoda kv meta v3");
  h.update(name);
  update_without_expiry(h, header_and_meta);
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

uint64_t EntryCodec::namespace_tag(const TierKey& key) const {
  HmacSha256 h(std::string_view(reinterpret_cast<const char*>(name_key_.data()), name_key_.size()));
  h.update("pagoda kv namespace");
  const uint64_t words[3] = {key.model_fingerprint, key.kv_dtype, key.block_size};
  h.update(words, sizeof(words));
  const Digest256 d = h.final();
  uint64_t ns = 0;
  std::memcpy(&ns, d.data(), sizeof(ns));
  return ns | 1;  // never 0 (0: an entry of no namespace)
}

size_t EntryCodec::head_size(size_t num_tokens) { return sizeof(Header) + meta_size(num_tokens) + kTagBytes; }

uint64_t EntryCodec::entry_size(uint64_t kv_bytes, size_t num_tokens) {
  return head_size(num_tokens) + kv_bytes + kTagBytes;
}

std::string EntryCodec::encode(const TierKey& key, std::span<const int32_t> tokens, std::string_view kv_bytes,
                               const Hash128* parent, uint64_t expiry_ms) const {
  Header h{};
  h.magic = kMagic;
  h.version = kVersion;
  h.kv_bytes = kv_bytes.size();
  h.expiry_ms = expiry_ms;
  h.ns = namespace_tag(key);
  h.meta_bytes = static_cast<uint32_t>(meta_size(tokens.size()));
  random_bytes(h.iv, sizeof(h.iv));
  random_bytes(h.meta_iv, sizeof(h.meta_iv));
  std::string meta(h.meta_bytes, '\0');
  const uint64_t words[4] = {key.chain.lo, key.chain.hi, parent ? parent->lo : 0, parent ? parent->hi : 0};
  const uint32_t small[2] = {key.group, (parent ? 0u : 1u) | (key.kind == TierKey::kCheckpoint ? 2u : 0u)};
  std::memcpy(meta.data(), words, sizeof(words));
  std::memcpy(meta.data() + sizeof(words), small, sizeof(small));
  std::memcpy(meta.data() + 40, tokens.data(), tokens.size_bytes());
  const size_t head = head_size(tokens.size());
  std::string out(entry_size(kv_bytes.size(), tokens.size()), '\0');
  std::memcpy(out.data(), &h, sizeof(h));
  aes256_ctr(enc_key_.data(), h.meta_iv, meta.data(), meta.size(), out.data() + sizeof(h));
  const Digest256 mtag = meta_mac(mac_key_, name(key), std::string_view(out.data(), sizeof(h) + meta.size()));
  std::memcpy(out.data() + sizeof(h) + meta.size(), mtag.data(), mtag.size());
  aes256_ctr(enc_key_.data(), h.iv, kv_bytes.data(), kv_bytes.size(), out.data() + head);
  const Digest256 tag = entry_mac(mac_key_, key, tokens, std::string_view(out.data(), head + kv_bytes.size()));
  std::memcpy(out.data() + head + kv_bytes.size(), tag.data(), tag.size());
  return out;
}

EntryHead EntryCodec::parse_head(std::string_view blob) {
  EntryHead e;
  Header h{};
  if (blob.size() < sizeof(h)) return e;
  std::memcpy(&h, blob.data(), sizeof(h));
  if (h.magic != kMagic || h.version != kVersion) return e;
  e.ours = true;
  e.expiry_ms = h.expiry_ms;
  e.ns = h.ns;
  return e;
}

bool EntryCodec::decode_meta(std::string_view name, std::string_view head, EntryMeta* out) const {
  Header h{};
  if (head.size() < sizeof(h)) return false;
  std::memcpy(&h, head.data(), sizeof(h));
  if (h.magic != kMagic || h.version != kVersion || h.meta_bytes < 40 || (h.meta_bytes - 40) % 4 != 0 ||
      head.size() < sizeof(h) + h.meta_bytes + kTagBytes) {
    return false;
  }
  const Digest256 mtag = meta_mac(mac_key_, name, head.substr(0, sizeof(h) + h.meta_bytes));
  if (!equal_constant_time(mtag.data(), head.data() + sizeof(h) + h.meta_bytes, mtag.size())) return false;
  std::string meta(h.meta_bytes, '\0');
  aes256_ctr(enc_key_.data(), h.meta_iv, head.data() + sizeof(h), meta.size(), meta.data());
  uint64_t words[4];
  uint32_t small[2];
  std::memcpy(words, meta.data(), sizeof(words));
  std::memcpy(small, meta.data() + sizeof(words), sizeof(small));
  out->chain = Hash128{words[0], words[1]};
  out->parent = Hash128{words[2], words[3]};
  out->group = small[0];
  out->root = (small[1] & 1u) != 0;
  out->kind = (small[1] & 2u) != 0 ? TierKey::kCheckpoint : TierKey::kBlock;
  out->tokens.resize((meta.size() - 40) / 4);
  std::memcpy(out->tokens.data(), meta.data() + 40, meta.size() - 40);
  return true;
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
  if (blob.size() != entry_size(kv_bytes_expected, tokens.size())) return DecodeResult::kCorrupt;
  std::memcpy(&h, blob.data(), sizeof(h));
  if (h.kv_bytes != kv_bytes_expected || h.meta_bytes != meta_size(tokens.size())) return DecodeResult::kCorrupt;
  const size_t head = head_size(tokens.size());
  const size_t body = head + kv_bytes_expected;
  const Digest256 tag = entry_mac(mac_key_, key, tokens, blob.substr(0, body));
  if (!equal_constant_time(tag.data(), blob.data() + body, tag.size())) return DecodeResult::kCorrupt;
  kv_bytes->resize(kv_bytes_expected);
  aes256_ctr(enc_key_.data(), h.iv, blob.data() + head, kv_bytes_expected, kv_bytes->data());
  return DecodeResult::kOk;
}

}  // namespace pagoda::tier
