// KV cache events in vLLM's wire format (issue 37): what the engine tells a
// cache-aware router about the blocks it stores and drops.
//
// An EventBatch collects one engine step's events (on the engine thread);
// encode_payload turns a batch into the msgpack payload of one ZeroMQ message:
//   [ts (float64, Unix seconds), [event, ...], data_parallel_rank (int)]
// with each event a tagged array (vLLM's msgspec array_like=True, tag=True):
//   ["BlockStored", block_hashes, parent_block_hash|nil, token_ids, block_size,
//    lora_id=nil, medium, lora_name=nil, extra_keys=nil, group_idx]
//   ["BlockRemoved", block_hashes, medium, group_idx]
//   ["AllBlocksCleared"]
// Hashes are the low 64 bits of the engine's 128-bit chain keys. Consecutive
// stores of one chain (same group and medium, each block's parent the previous
// block) are merged into one BlockStored, and consecutive removals of one
// group and medium into one BlockRemoved; the events still name every block
// exactly once. Not thread-safe (one batch per step, handed over whole).
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace pagoda::kv_events {

enum class EventKind : uint8_t { kBlockStored, kBlockRemoved, kAllBlocksCleared };

struct KvEvent {
  EventKind kind = EventKind::kAllBlocksCleared;
  std::vector<uint64_t> block_hashes;
  std::optional<uint64_t> parent_block_hash;  // BlockStored: nullopt for the first block of a sequence
  std::vector<int32_t> token_ids;             // BlockStored: block_size per block, concatenated
  int32_t block_size = 0;                     // BlockStored
  std::string medium;                         // "cpu", "disk", "redis"
  int32_t group = 0;                          // the KV cache group
};

class EventBatch {
 public:
  void stored(uint64_t hash, std::optional<uint64_t> parent, std::span<const int32_t> tokens, int32_t block_size,
              const char* medium, int32_t group);
  void removed(uint64_t hash, const char* medium, int32_t group);
  void cleared();
  bool empty() const { return events_.empty(); }
  size_t size() const { return events_.size(); }
  // Blocks named by the events (hashes summed; 1 for AllBlocksCleared).
  int64_t num_blocks() const { return num_blocks_; }
  const std::vector<KvEvent>& events() const { return events_; }
  std::vector<KvEvent> take();

 private:
  std::vector<KvEvent> events_;
  int64_t num_blocks_ = 0;
};

// The msgpack payload [ts, events, data_parallel_rank].
std::string encode_payload(double ts, std::span<const KvEvent> events, int64_t data_parallel_rank = 0);

}  // namespace pagoda::kv_events
