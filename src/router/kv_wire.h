// The KV event wire format `pagoda router --kv-events` reads (issue 37; vLLM's
// ZmqEventPublisher in its msgspec array_like form): each ZeroMQ message is
// [topic, sequence number (8-byte big-endian), payload], the payload a msgpack
// array [ts, [event, ...], data_parallel_rank], each event a tagged array:
//   ["BlockStored", block_hashes, parent_block_hash|nil, token_ids, block_size,
//    lora_id, medium, lora_name, extra_keys, group_idx]
//   ["BlockRemoved", block_hashes, medium, group_idx]
//   ["AllBlocksCleared"]
// The decoder is strict about what it uses (types, counts, bounds: every byte is
// checked before it is read) and lenient about what it does not: trailing
// fields it does not know are skipped, a missing medium is "cpu" and a missing
// group_idx is 0, as in vLLM's older events.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"

namespace pagoda::router {

enum class KvEventKind { kStored, kRemoved, kCleared };

struct KvEvent {
  KvEventKind kind = KvEventKind::kCleared;
  std::vector<uint64_t> block_hashes;       // stored/removed, in chain order
  std::optional<uint64_t> parent_hash;      // stored: nil (nullopt) for a sequence's first block
  std::vector<int32_t> token_ids;           // stored: block_size x block_hashes.size() ids
  int64_t block_size = 0;                   // stored
  std::string medium = "cpu";               // stored/removed
  int64_t group_idx = 0;                    // stored/removed
};

struct KvEventBatch {
  double ts = 0;
  std::vector<KvEvent> events;
  int64_t dp_rank = 0;
};

// Decodes one payload. An error names what is wrong (and the event's index); a
// BlockStored whose token_ids do not hold block_size ids per hash is an error.
Expected<KvEventBatch> decode_kv_batch(const void* data, size_t size);

// The 8-byte big-endian sequence number of a message; nullopt unless size == 8.
std::optional<uint64_t> decode_seq(const void* data, size_t size);
void encode_seq(uint64_t seq, unsigned char out[8]);

}  // namespace pagoda::router
