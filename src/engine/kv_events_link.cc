#include "engine/kv_events_link.h"

namespace pagoda::engine {

Expected<std::unique_ptr<KvEventLink>> KvEventLink::create(const std::string& config_json, int32_t block_size) {
  if (config_json.empty()) return std::unique_ptr<KvEventLink>();
  PAGODA_ASSIGN_OR_RETURN(const kv_events::KvEventsConfig cfg, kv_events::KvEventsConfig::parse(config_json));
  if (!cfg.enabled()) return std::unique_ptr<KvEventLink>();
  std::unique_ptr<KvEventLink> link(new KvEventLink());
  PAGODA_ASSIGN_OR_RETURN(link->publisher_, kv_events::Publisher::start(cfg));
  link->block_size_ = block_size;
  return link;
}

void KvEventLink::block_stored(const Hash128& chain, const Hash128* parent, std::span<const kv::TokenId> tokens,
                               int32_t group) {
  batch_.stored(chain.lo, parent ? std::optional<uint64_t>(parent->lo) : std::nullopt, tokens, block_size_, "cpu",
                group);
}

void KvEventLink::block_removed(const Hash128& chain, int32_t group) { batch_.removed(chain.lo, "cpu", group); }

void KvEventLink::all_cleared() { batch_.cleared(); }

void KvEventLink::tier_stored(const char* medium, const Hash128& chain, const Hash128* parent,
                              std::span<const int32_t> tokens, int32_t group) {
  batch_.stored(chain.lo, parent ? std::optional<uint64_t>(parent->lo) : std::nullopt, tokens, block_size_, medium,
                group);
}

void KvEventLink::tier_removed(const char* medium, const Hash128& chain, int32_t group) {
  batch_.removed(chain.lo, medium, group);
}

void KvEventLink::flush() {
  if (!batch_.empty()) publisher_->publish(batch_.take());
}

}  // namespace pagoda::engine
