#include "base/hash.h"

#include <xxhash.h>

namespace pagoda {

uint64_t xxh3_64(const void* data, size_t len, uint64_t seed) { return XXH3_64bits_withSeed(data, len, seed); }

Hash128 xxh3_128(const void* data, size_t len, uint64_t seed) {
  XXH128_hash_t h = XXH3_128bits_withSeed(data, len, seed);
  return Hash128{h.low64, h.high64};
}

Hasher128::Hasher128(uint64_t seed) {
  auto* s = XXH3_createState();
  XXH3_128bits_reset_withSeed(s, seed);
  state_ = s;
}
Hasher128::~Hasher128() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }
void Hasher128::update(const void* data, size_t len) { XXH3_128bits_update(static_cast<XXH3_state_t*>(state_), data, len); }
Hash128 Hasher128::digest() const {
  XXH128_hash_t h = XXH3_128bits_digest(static_cast<XXH3_state_t*>(state_));
  return Hash128{h.low64, h.high64};
}

}  // namespace pagoda
