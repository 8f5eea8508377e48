#include "kv_events/events.h"

#include <msgpuck.h>

#include <utility>

namespace pagoda::kv_events {

void EventBatch::stored(uint64_t hash, std::optional<uint64_t> parent, std::span<const int32_t> tokens,
                        int32_t block_size, const char* medium, int32_t group) {
  ++num_blocks_;
  if (!events_.empty()) {
    KvEvent& last = events_.back();
    if (last.kind == EventKind::kBlockStored && last.group == group && last.medium == medium &&
        last.block_size == block_size && parent && *parent == last.block_hashes.back()) {
      last.block_hashes.push_back(hash);
      last.token_ids.insert(last.token_ids.end(), tokens.begin(), tokens.end());
      return;
    }
  }
  KvEvent e;
  e.kind = EventKind::kBlockStored;
  e.block_hashes.push_back(hash);
  e.parent_block_hash = parent;
  e.token_ids.assign(tokens.begin(), tokens.end());
  e.block_size = block_size;
  e.medium = medium;
  e.group = group;
  events_.push_back(std::move(e));
}

void EventBatch::removed(uint64_t hash, const char* medium, int32_t group) {
  ++num_blocks_;
  if (!events_.empty()) {
    KvEvent& last = events_.back();
    if (last.kind == EventKind::kBlockRemoved && last.group == group && last.medium == medium) {
      last.block_hashes.push_back(hash);
      return;
    }
  }
  KvEvent e;
  e.kind = EventKind::kBlockRemoved;
  e.block_hashes.push_back(hash);
  e.medium = medium;
  e.group = group;
  events_.push_back(std::move(e));
}

void EventBatch::cleared() {
  ++num_blocks_;
  events_.push_back(KvEvent{});
}

std::vector<KvEvent> EventBatch::take() {
  num_blocks_ = 0;
  return std::exchange(events_, {});
}

namespace {

// Appends msgpack values to a string (msgpuck writes into a buffer sized by mp_sizeof_*).
class Writer {
 public:
  explicit Writer(std::string* out) : out_(out) {}
  void array(uint32_t n) { put(mp_sizeof_array(n), [&](char* p) { return mp_encode_array(p, n); }); }
  void nil() { put(mp_sizeof_nil(), [&](char* p) { return mp_encode_nil(p); }); }
  void uint(uint64_t v) { put(mp_sizeof_uint(v), [&](char* p) { return mp_encode_uint(p, v); }); }
  void sint(int64_t v) {
    if (v >= 0) return uint(static_cast<uint64_t>(v));
    put(mp_sizeof_int(v), [&](char* p) { return mp_encode_int(p, v); });
  }
  void dbl(double v) { put(mp_sizeof_double(v), [&](char* p) { return mp_encode_double(p, v); }); }
  void str(const std::string& s) {
    const auto n = static_cast<uint32_t>(s.size());
    put(mp_sizeof_str(n), [&](char* p) { return mp_encode_str(p, s.data(), n); });
  }

 private:
  template <class F>
  void put(uint32_t size, F&& encode) {
    const size_t at = out_->size();
    out_->resize(at + size);
    encode(out_->data() + at);
  }
  std::string* out_;
};

void encode_event(Writer& w, const KvEvent& e) {
  static const std::string kStored = "BlockStored", kRemoved = "BlockRemoved", kCleared = "AllBlocksCleared";
  switch (e.kind) {
    case EventKind::kBlockStored:
      w.array(10);
      w.str(kStored);
      w.array(static_cast<uint32_t>(e.block_hashes.size()));
      for (uint64_t h : e.block_hashes) w.uint(h);
      if (e.parent_block_hash) w.uint(*e.parent_block_hash); else w.nil();
      w.array(static_cast<uint32_t>(e.token_ids.size()));
      for (int32_t t : e.token_ids) w.sint(t);
      w.sint(e.block_size);
      w.nil();  // lora_id
      w.str(e.medium);
      w.nil();  // lora_name
      w.nil();  // extra_keys
      w.sint(e.group);
      return;
    case EventKind::kBlockRemoved:
      w.array(4);
      w.str(kRemoved);
      w.array(static_cast<uint32_t>(e.block_hashes.size()));
      for (uint64_t h : e.block_hashes) w.uint(h);
      w.str(e.medium);
      w.sint(e.group);
      return;
    case EventKind::kAllBlocksCleared:
      w.array(1);
      w.str(kCleared);
      return;
  }
}

}  // namespace

std::string encode_payload(double ts, std::span<const KvEvent> events, int64_t data_parallel_rank) {
  std::string out;
  Writer w(&out);
  w.array(3);
  w.dbl(ts);
  w.array(static_cast<uint32_t>(events.size()));
  for (const KvEvent& e : events) encode_event(w, e);
  w.sint(data_parallel_rank);
  return out;
}

}  // namespace pagoda::kv_events
