// KvEventSink: what the prefix cache tells a listener about its entries (the
// KV events of issue 37). The PrefixCache is the one owner of entries, so it
// is the one caller: block_stored for every block that becomes an entry (a
// commit, a tier import, a key taken over), block_removed for every entry that
// leaves (eviction for reuse, a key taken over by a live chain); a reset of the
// whole cache calls all_cleared (KvManager::notify_all_cleared). Null by
// default: no sink, no work. Called on the thread that mutates the cache.
#pragma once
#include <cstdint>
#include <span>

#include "base/hash.h"
#include "kv/types.h"

namespace pagoda::kv {

class KvEventSink {
 public:
  virtual ~KvEventSink() = default;
  // `chain`: the block's chain key (group 0's key for every group: a window
  // group's entry is keyed by a hash of it); `parent`: the previous block's
  // chain key, nullptr for the first block of a sequence.
  virtual void block_stored(const Hash128& chain, const Hash128* parent, std::span<const TokenId> tokens,
                            int32_t group) = 0;
  virtual void block_removed(const Hash128& chain, int32_t group) = 0;
  virtual void all_cleared() = 0;
};

}  // namespace pagoda::kv
