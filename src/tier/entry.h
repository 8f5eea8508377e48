// The KV tier entry: one full KV block stored below RAM (disk, Redis).
//
// An entry is addressed by a TierKey: everything that must be equal for the
// block's K/V bytes to be reusable. The model fingerprint (weights and
// hyper-parameters), the KV dtype, the block size, the KV group, the cache salt
// (tenant isolation) and the block's chain hash (the prefix-cache key, which
// covers every token before it). name() is the hex XXH3-128 of those fields:
// the file name on disk and the Redis key.
//
// The payload repeats the key fields, the block's token ids and the K/V bytes,
// and ends with an XXH3-64 checksum of everything before it. A name is never
// trusted alone: decode_entry() checks the length, the checksum, every key
// field and the tokens, so a torn file, a flipped byte, a different model or
// salt, or a hash collision is a miss, never wrong K/V.
#pragma once
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

  // 32 lowercase hex digits (XXH3-128 of every field).
  std::string name() const;
};

// Payload = header (key fields, counts) + salt + tokens + K/V bytes + checksum.
std::string encode_entry(const TierKey& key, std::span<const int32_t> tokens, std::string_view kv_bytes);

enum class DecodeResult {
  kOk,
  kCorrupt,   // too short, bad magic/version, lengths disagree with the size, checksum mismatch
  kMismatch,  // intact, but a key field, the tokens or the K/V size differ from what was asked
};
const char* decode_result_name(DecodeResult r);

// Verifies `blob` as the entry of `key` holding `tokens` and `kv_bytes_expected`
// bytes of K/V; on kOk, *kv_bytes holds those bytes.
DecodeResult decode_entry(std::string_view blob, const TierKey& key, std::span<const int32_t> tokens,
                          uint64_t kv_bytes_expected, std::string* kv_bytes);

}  // namespace pagoda::tier
