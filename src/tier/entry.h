// The KV tier entry: one full KV block stored below RAM (disk, Redis).
//
// An entry is addressed by a TierKey: everything that must be equal for the
// block's K/V bytes to be reusable. The model fingerprint (weights and
// hyper-parameters), the KV dtype, the block size, the KV group, the cache salt
// (tenant isolation) and the block's chain hash (the prefix-cache key, which
// covers every token before it).
//
// Whoever can read or write the store (the disk directory, Redis) must not
// learn a prompt or a tenant from an entry, nor plant one that is served. So
// every entry is keyed by the deployment's secret (`--kv-tier-secret`, the same
// on every replica sharing a tier), through three keys derived from it:
//  - the name (file name, Redis key) is 32 hex digits of HMAC-SHA256(name key,
//    key fields): without the secret a name cannot be computed from a guessed
//    API key or prompt, so it is no offline oracle for either;
//  - the K/V bytes are encrypted (AES-256-CTR, a random IV per entry); the
//    token ids and the key fields (salt, tenant tag) are not stored at all;
//  - a MAC, HMAC-SHA256(mac key, key fields, token ids, header, ciphertext),
//    ends the entry: the reader recomputes it from the key and tokens it asks
//    for, so a torn, flipped, forged or swapped (renamed) entry is corrupt and
//    never served.
// Format version 3 (issues 36, 37): the header adds the entry's expiry (unix
// ms, 0: none; a pinned prefix's TTL), a namespace tag (namespace_tag: which
// engine's entries a reset clears) and an encrypted meta section (chain,
// parent and token ids: what a replica restarting on the disk tier announces
// in its KV events), with its own MAC bound to the entry's name. The expiry
// alone is outside the MACs, so that a renewed pin rewrites 8 bytes in place:
// whoever can write the store can change when an entry expires, which is no
// more than deleting it or putting an old copy back (both possible already);
// it can never make an entry serve other bytes. An entry of another version
// (1: tokens and salt in plain form; 2: no expiry, no meta) is a kMismatch:
// ignored and left alone.
// Without a secret (a single-tenant deployment) the keys derive from the empty
// secret: integrity is checked the same way but the store's readers are trusted.
#pragma once
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/hash.h"

namespace pagoda::tier {

struct TierKey {
  uint64_t model_fingerprint = 0;
  uint32_t kv_dtype = 0;    // base/kv_dtype.h's KvDtype as an integer
  uint32_t block_size = 0;  // tokens per block
  uint32_t group = 0;       // KV cache group
  std::string cache_salt;
  Hash128 chain;            // the block's prefix-cache key
  // What the entry holds (issue 38): a K/V block, or the recurrent-state
  // checkpoint of a hybrid model taken at the end of block `chain` (its S
  // state blocks, one entry; kv/state_checkpoint.cc). Part of the name and of
  // both MACs: an entry of one kind never decodes as the other. kBlock hashes
  // as before the field existed (v3 entries keep their names).
  enum Kind : uint32_t { kBlock = 0, kCheckpoint = 1 };
  uint32_t kind = kBlock;
};

// What a KV event announces of an entry; stored encrypted in it (v3).
struct EntryMeta {
  Hash128 chain, parent;  // parent: meaningless when root
  bool root = true;
  uint32_t group = 0;
  uint32_t kind = TierKey::kBlock;  // TierKey::Kind (KV events announce only blocks)
  std::vector<int32_t> tokens;
};

// The plain fields of an entry's header, read without the key (the disk tier's index).
struct EntryHead {
  bool ours = false;       // the magic and this format version
  uint64_t expiry_ms = 0;  // unix ms; 0: none
  uint64_t ns = 0;         // namespace_tag of its key
};

enum class DecodeResult {
  kOk,
  kCorrupt,   // wrong size or magic, or the MAC fails: torn, flipped, forged, another key's (swapped)
  kMismatch,  // an entry of another format version: ignored, left in place
};
const char* decode_result_name(DecodeResult r);

// The entry format under one deployment secret. Thread-safe (const).
class EntryCodec {
 public:
  explicit EntryCodec(std::string_view secret = {});

  // 32 lowercase hex digits: the file name and the Redis key.
  std::string name(const TierKey& key) const;
  // 64 bits of a keyed hash of the key's model fingerprint, KV dtype and block
  // size: one engine's entries (every salt), never another model's.
  uint64_t namespace_tag(const TierKey& key) const;
  // The size of every entry holding `kv_bytes` bytes of K/V for `num_tokens`
  // tokens: a read never takes more.
  static uint64_t entry_size(uint64_t kv_bytes, size_t num_tokens);
  // The bytes before the K/V (header, meta, meta MAC): what decode_meta reads.
  static size_t head_size(size_t num_tokens);
  static constexpr size_t kMaxHeadBytes = 2048;  // head_size of a 256-token block fits
  static constexpr size_t kExpiryOffset = 16;    // the expiry's 8 bytes in the header (native order)
  // `parent`: the previous block's chain key (nullptr: the first block).
  std::string encode(const TierKey& key, std::span<const int32_t> tokens, std::string_view kv_bytes,
                     const Hash128* parent = nullptr, uint64_t expiry_ms = 0) const;
  static EntryHead parse_head(std::string_view blob);
  // The meta of the entry stored under `name`, from its first bytes (at least
  // head_size); false when torn, forged, moved from another name or not v3.
  bool decode_meta(std::string_view name, std::string_view head, EntryMeta* out) const;
  // Verifies `blob` as the entry of `key` holding `tokens` and `kv_bytes_expected`
  // bytes of K/V; on kOk, *kv_bytes holds those bytes (decrypted).
  DecodeResult decode(std::string_view blob, const TierKey& key, std::span<const int32_t> tokens,
                      uint64_t kv_bytes_expected, std::string* kv_bytes) const;

 private:
  std::array<uint8_t, 32> name_key_{}, mac_key_{}, enc_key_{};
};

}  // namespace pagoda::tier
