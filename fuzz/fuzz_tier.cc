// libFuzzer target for tier/: the input is a tier entry as read from a store
// (a disk file, a Redis value). The first byte picks the check:
//  - even: the rest is decoded as the entry of a fixed key and tokens, with the
//    K/V size the blob's length implies (so the MAC path runs), and once more
//    with a size from the input; a kOk must hold exactly that many bytes and
//    must be an entry encode() could have made (re-encoding round-trips);
//  - odd: the rest is K/V bytes: encode then decode must give them back, and
//    one flipped byte (position from the input), another key or other tokens
//    must never decode (but the expiry's bytes, outside the MACs), and the
//    meta (chain, tokens) must read back from the head.
// Seeds (fuzz/seeds/fuzz_tier) hold valid (format v3) entries of that key,
// old-version entries (1, 2), torn ones.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "tier/entry.h"

using namespace pagoda;
using namespace pagoda::tier;

namespace {

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_tier: %s\n", what);
  std::abort();
}

TierKey fuzz_key() {
  TierKey k;
  k.model_fingerprint = 0x1234;
  k.kv_dtype = 1;
  k.block_size = 4;
  k.group = 0;
  k.cache_salt = "fuzz-tenant";
  k.chain = Hash128{42, ~42ull};
  return k;
}

const std::vector<int32_t> kTokens = {1, 2, 3, 4};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const EntryCodec codec("the fuzz target's secret");
  static const TierKey key = fuzz_key();
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  std::string out;
  if ((data[0] & 1) == 0) {
    const uint64_t empty = EntryCodec::entry_size(0, kTokens.size());
    const uint64_t implied = rest.size() >= empty ? rest.size() - empty : 0;
    for (uint64_t want : {implied, uint64_t{data[0]} * 3}) {
      const DecodeResult r = codec.decode(rest, key, kTokens, want, &out);
      if (r != DecodeResult::kOk) {
        if (!out.empty()) fail("a rejected entry left K/V bytes behind");
        continue;
      }
      if (out.size() != want) fail("a verified entry holds another K/V size");
      std::string again;
      if (codec.decode(codec.encode(key, kTokens, out), key, kTokens, want, &again) != DecodeResult::kOk || again != out)
        fail("a verified entry does not round-trip");
    }
    return 0;
  }
  const std::string blob = codec.encode(key, kTokens, rest);
  if (blob.size() != EntryCodec::entry_size(rest.size(), kTokens.size())) fail("encode: wrong size");
  if (codec.decode(blob, key, kTokens, rest.size(), &out) != DecodeResult::kOk || out != rest) fail("round trip");
  std::string bad = blob;
  const size_t at = (size_t{data[0]} * 2654435761u) % bad.size();
  bad[at] = static_cast<char>(bad[at] ^ (1 << (data[0] % 8)));
  // The expiry's 8 bytes are outside the MACs (tier/entry.h): flipped, the entry still holds the same K/V.
  const bool expiry = at >= EntryCodec::kExpiryOffset && at < EntryCodec::kExpiryOffset + 8;
  const DecodeResult flipped = codec.decode(bad, key, kTokens, rest.size(), &out);
  if (expiry ? flipped != DecodeResult::kOk || out != rest : flipped == DecodeResult::kOk) fail("a flipped byte decoded");
  EntryMeta meta;
  if (!codec.decode_meta(codec.name(key), blob, &meta) || meta.tokens != kTokens || !(meta.chain == key.chain))
    fail("the meta does not round-trip");
  TierKey other = key;
  other.cache_salt = "another-tenant";
  if (codec.decode(blob, other, kTokens, rest.size(), &out) == DecodeResult::kOk) fail("another tenant read it");
  const std::vector<int32_t> other_tokens = {1, 2, 3, 5};
  if (codec.decode(blob, key, other_tokens, rest.size(), &out) == DecodeResult::kOk) fail("other tokens read it");
  return 0;
}
