// KvEventLink: the engine's side of the KV events (issue 37,
// kv_events/publisher.h). It is the KvManager's event sink (kv/event_sink.h):
// the prefix cache reports every entry made and dropped, on the engine thread,
// into this step's EventBatch (medium "cpu"); the KV tiers add their stores and
// drops (medium "disk" / "redis"). flush() hands the batch to the publisher
// thread at the end of a step (one message per step with events); the engine
// never waits for a subscriber. Engine thread only.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "base/status.h"
#include "kv/event_sink.h"
#include "kv_events/events.h"
#include "kv_events/publisher.h"

namespace pagoda::engine {

class KvEventLink final : public kv::KvEventSink {
 public:
  // Starts the publisher; nullptr (no error) when the config turns events off.
  static Expected<std::unique_ptr<KvEventLink>> create(const std::string& config_json, int32_t block_size);

  void block_stored(const Hash128& chain, const Hash128* parent, std::span<const kv::TokenId> tokens,
                    int32_t group) override;
  void block_removed(const Hash128& chain, int32_t group) override;
  void all_cleared() override;
  // A tier (medium "disk", "redis") now holds / no longer holds a block.
  void tier_stored(const char* medium, const Hash128& chain, const Hash128* parent, std::span<const int32_t> tokens,
                   int32_t group);
  void tier_removed(const char* medium, const Hash128& chain, int32_t group);
  // Hands this step's events to the publisher (one message); nothing when none.
  void flush();
  kv_events::PublisherStats stats() const { return publisher_->stats(); }

 private:
  KvEventLink() = default;
  std::unique_ptr<kv_events::Publisher> publisher_;
  kv_events::EventBatch batch_;
  int32_t block_size_ = 0;
};

}  // namespace pagoda::engine
