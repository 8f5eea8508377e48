// KV events (issue 37): the msgpack payload byte for byte through msgpuck's
// decoder, the event batch's merging, the KvManager's hooks (exact chain keys
// stored and removed on scripted allocate / commit / evict / free / fork /
// window release / import, checked against the cache after every step), and
// the publisher's PUB and replay sockets.
#include <gtest/gtest.h>
#include <msgpuck.h>
#include <unistd.h>
#include <zmq.h>

#include <chrono>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "kv/kv_manager.h"
#include "kv/test_util.h"
#include "kv_events/events.h"
#include "kv_events/publisher.h"

namespace pagoda {
namespace {

using kv_events::EventBatch;
using kv_events::EventKind;
using kv_events::KvEvent;

// ---- a small msgpack reader over msgpuck (test side) ----
struct Reader {
  const char* p;
  const char* end;
  mp_type type() const { return mp_typeof(*p); }
  uint32_t array() {
    EXPECT_EQ(type(), MP_ARRAY);
    return mp_decode_array(&p);
  }
  std::string str() {
    EXPECT_EQ(type(), MP_STR);
    uint32_t n = 0;
    const char* s = mp_decode_str(&p, &n);
    return std::string(s, n);
  }
  uint64_t uint() {
    EXPECT_EQ(type(), MP_UINT);
    return mp_decode_uint(&p);
  }
  int64_t sint() { return type() == MP_UINT ? static_cast<int64_t>(mp_decode_uint(&p)) : mp_decode_int(&p); }
  bool nil() {
    if (type() != MP_NIL) return false;
    mp_decode_nil(&p);
    return true;
  }
  double dbl() {
    EXPECT_EQ(type(), MP_DOUBLE);
    return mp_decode_double(&p);
  }
};

// Decodes a payload back into events (the reader checks every type on the way).
std::vector<KvEvent> decode(const std::string& payload, double* ts, int64_t* rank) {
  const char* b = payload.data();
  EXPECT_EQ(mp_check(&b, payload.data() + payload.size()), 0) << "not one valid msgpack value";
  EXPECT_EQ(b, payload.data() + payload.size()) << "trailing bytes";
  Reader r{payload.data(), payload.data() + payload.size()};
  EXPECT_EQ(r.array(), 3u);
  *ts = r.dbl();
  const uint32_t n = r.array();
  std::vector<KvEvent> out;
  for (uint32_t i = 0; i < n; ++i) {
    KvEvent e;
    const uint32_t fields = r.array();
    const std::string tag = r.str();
    if (tag == "BlockStored") {
      EXPECT_EQ(fields, 10u);
      e.kind = EventKind::kBlockStored;
      for (uint32_t k = r.array(); k > 0; --k) e.block_hashes.push_back(r.uint());
      if (!r.nil()) e.parent_block_hash = r.uint();
      for (uint32_t k = r.array(); k > 0; --k) e.token_ids.push_back(static_cast<int32_t>(r.sint()));
      e.block_size = static_cast<int32_t>(r.sint());
      EXPECT_TRUE(r.nil()) << "lora_id";
      e.medium = r.str();
      EXPECT_TRUE(r.nil()) << "lora_name";
      EXPECT_TRUE(r.nil()) << "extra_keys";
      e.group = static_cast<int32_t>(r.sint());
    } else if (tag == "BlockRemoved") {
      EXPECT_EQ(fields, 4u);
      e.kind = EventKind::kBlockRemoved;
      for (uint32_t k = r.array(); k > 0; --k) e.block_hashes.push_back(r.uint());
      e.medium = r.str();
      e.group = static_cast<int32_t>(r.sint());
    } else {
      EXPECT_EQ(tag, "AllBlocksCleared");
      EXPECT_EQ(fields, 1u);
    }
    out.push_back(std::move(e));
  }
  *rank = r.sint();
  EXPECT_EQ(r.p, r.end);
  return out;
}

TEST(KvEventsEncoder, RoundTripsThroughMsgpuck) {
  EventBatch b;
  const std::vector<int32_t> t1 = {1, 2, 3, 4}, t2 = {5, 6, 7, 8}, t3 = {-1, 70000, 0, 2147483647};
  b.cleared();
  b.stored(0xffffffffffffffffULL, std::nullopt, t1, 4, "cpu", 0);
  b.stored(42, 0xffffffffffffffffULL, t2, 4, "cpu", 0);  // extends the chain: merged
  b.stored(7, 99, t3, 4, "cpu", 0);                       // another parent: a new event
  b.stored(8, 7, t1, 4, "cpu", 1);                        // another group: a new event
  b.removed(5, "cpu", 0);
  b.removed(6, "cpu", 0);     // merged
  b.removed(9, "disk", 0);    // another medium
  ASSERT_EQ(b.size(), 6u);
  EXPECT_EQ(b.num_blocks(), 8);
  const std::vector<KvEvent> events = b.take();
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(b.num_blocks(), 0);
  const std::string payload = kv_events::encode_payload(1234.5, events, 0);
  double ts = 0;
  int64_t rank = -1;
  const std::vector<KvEvent> got = decode(payload, &ts, &rank);
  EXPECT_EQ(ts, 1234.5);
  EXPECT_EQ(rank, 0);
  ASSERT_EQ(got.size(), 6u);
  EXPECT_EQ(got[0].kind, EventKind::kAllBlocksCleared);
  EXPECT_EQ(got[1].kind, EventKind::kBlockStored);
  EXPECT_EQ(got[1].block_hashes, (std::vector<uint64_t>{0xffffffffffffffffULL, 42}));
  EXPECT_FALSE(got[1].parent_block_hash.has_value());
  EXPECT_EQ(got[1].token_ids, (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(got[1].block_size, 4);
  EXPECT_EQ(got[1].medium, "cpu");
  EXPECT_EQ(got[1].group, 0);
  EXPECT_EQ(got[2].block_hashes, (std::vector<uint64_t>{7}));
  EXPECT_EQ(got[2].parent_block_hash, std::optional<uint64_t>(99));
  EXPECT_EQ(got[2].token_ids, t3);
  EXPECT_EQ(got[3].group, 1);
  EXPECT_EQ(got[3].parent_block_hash, std::optional<uint64_t>(7));
  EXPECT_EQ(got[4].kind, EventKind::kBlockRemoved);
  EXPECT_EQ(got[4].block_hashes, (std::vector<uint64_t>{5, 6}));
  EXPECT_EQ(got[4].medium, "cpu");
  EXPECT_EQ(got[5].block_hashes, (std::vector<uint64_t>{9}));
  EXPECT_EQ(got[5].medium, "disk");
  // The exact head bytes: fixarray(3), float64 1234.5, fixarray(6), fixarray(1), fixstr(16) "AllBlocksCleared".
  const std::string head = std::string("\x93\xcb\x40\x93\x4a\x00\x00\x00\x00\x00\x96\x91\xb0", 13) + "AllBlocksCleared";
  EXPECT_EQ(payload.substr(0, head.size()), head);
  EXPECT_EQ(static_cast<uint8_t>(payload.back()), 0x00) << "data_parallel_rank 0 last";
}

// ---- KvManager hooks ----
// Records the events and keeps the view a subscriber would: (group, chain.lo).
class Recorder final : public kv::KvEventSink {
 public:
  void block_stored(const Hash128& chain, const Hash128* parent, std::span<const kv::TokenId> tokens,
                    int32_t group) override {
    stored.push_back({group, chain, parent ? std::optional<Hash128>(*parent) : std::nullopt,
                      std::vector<kv::TokenId>(tokens.begin(), tokens.end())});
    EXPECT_TRUE(view.insert({group, chain.lo}).second) << "stored twice";
  }
  void block_removed(const Hash128& chain, int32_t group) override {
    removed.push_back({group, chain.lo});
    EXPECT_EQ(view.erase({group, chain.lo}), 1u) << "removed without being stored";
  }
  void all_cleared() override {
    ++cleared;
    view.clear();
  }
  struct Stored {
    int32_t group;
    Hash128 chain;
    std::optional<Hash128> parent;
    std::vector<kv::TokenId> tokens;
  };
  std::vector<Stored> stored;
  std::vector<std::pair<int32_t, uint64_t>> removed;
  std::set<std::pair<int32_t, uint64_t>> view;
  int cleared = 0;
  void reset() {
    stored.clear();
    removed.clear();
  }
};

// The cache's own entries as (group, chain.lo).
std::set<std::pair<int32_t, uint64_t>> cache_view(const kv::KvManager& kv) {
  std::set<std::pair<int32_t, uint64_t>> v;
  for (kv::BlockId b = 1; b < kv.pool().num_blocks(); ++b)
    if (kv.cache().contains(b)) v.insert({kv.cache().group_of(b), kv.cache().chain_of(b).lo});
  return v;
}

// The chain keys of `tokens`' full blocks, computed here from the hash alone.
std::vector<Hash128> keys_of(const kv::KvManager& kv, const std::vector<kv::TokenId>& tokens) {
  std::vector<Hash128> out;
  const size_t bs = static_cast<size_t>(kv.block_size());
  Hash128 parent{};
  for (size_t i = 0; i + bs <= tokens.size(); i += bs) {
    parent = kv.cache().key(parent, std::span<const kv::TokenId>(tokens).subspan(i, bs), "");
    out.push_back(parent);
  }
  return out;
}

TEST(KvEventHooks, ExactHashesOnCommitEvictAndFree) {
  // 4 usable blocks of 4 tokens.
  kv::KvManager kv(kv::testing::make_config(5, 4));
  Recorder rec;
  kv.set_event_sink(&rec);
  auto step_ok = [&] {
    EXPECT_EQ(rec.view, cache_view(kv));
    EXPECT_EQ(kv.check_invariants(), "");
  };
  const auto a = kv::testing::iota_tokens(100, 9);  // 2 full blocks + 1 token
  ASSERT_TRUE(kv.allocate(1, a, 9, "").ok());
  step_ok();
  EXPECT_TRUE(rec.stored.empty()) << "allocation commits nothing";
  kv.mark_computed(1, a, 9);
  const auto ka = keys_of(kv, a);
  ASSERT_EQ(rec.stored.size(), 2u);
  EXPECT_EQ(rec.stored[0].chain, ka[0]);
  EXPECT_FALSE(rec.stored[0].parent.has_value());
  EXPECT_EQ(rec.stored[0].tokens, kv::testing::iota_tokens(100, 4));
  EXPECT_EQ(rec.stored[1].chain, ka[1]);
  EXPECT_EQ(rec.stored[1].parent, std::optional<Hash128>(ka[0]));
  EXPECT_EQ(rec.stored[1].tokens, kv::testing::iota_tokens(104, 4));
  step_ok();
  // Fork: the child shares the blocks; committing its (same) blocks again is no new entry.
  ASSERT_TRUE(kv.fork(1, 2).ok());
  kv.mark_computed(2, a, 9);
  EXPECT_EQ(rec.stored.size(), 2u);
  step_ok();
  ASSERT_TRUE(kv.free(2));
  ASSERT_TRUE(kv.free(1));  // cached-evictable now: still entries, no event
  EXPECT_TRUE(rec.removed.empty());
  step_ok();
  rec.reset();
  // Another prompt needs 3 blocks: the free queue is [4 (never cached), 3 (a's partial), 2 (a's 2nd), 1 (a's 1st)]
  // after free released last first; taking 3 evicts a's 2nd block only.
  const auto b = kv::testing::iota_tokens(500, 12);
  ASSERT_TRUE(kv.allocate(3, b, 12, "").ok());
  ASSERT_EQ(rec.removed.size(), 1u);
  EXPECT_EQ(rec.removed[0], std::make_pair(0, ka[1].lo));
  step_ok();
  kv.mark_computed(3, b, 12);
  const auto kb = keys_of(kv, b);
  ASSERT_EQ(rec.stored.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(rec.stored[i].chain, kb[i]);
  step_ok();
  // a's first block is still cached: a new request for a hits it (no event), and
  // its second block must be recomputed: evicting b's tail (the only evictable block left after b is freed).
  ASSERT_TRUE(kv.free(3));
  rec.reset();
  ASSERT_TRUE(kv.allocate(4, a, 5, "").ok());  // 4 cached + 5 new: 3 blocks -> 1 hit, 2 taken
  EXPECT_TRUE(rec.stored.empty());
  EXPECT_EQ(rec.removed.size(), 2u);
  step_ok();
  kv.mark_computed(4, a, 9);
  ASSERT_EQ(rec.stored.size(), 1u);
  EXPECT_EQ(rec.stored[0].chain, ka[1]);
  EXPECT_EQ(rec.stored[0].parent, std::optional<Hash128>(ka[0]));
  step_ok();
  // The reset hook publishes AllBlocksCleared.
  kv.notify_all_cleared();
  EXPECT_EQ(rec.cleared, 1);
  // Without a sink nothing is reported and nothing changes.
  kv.set_event_sink(nullptr);
  ASSERT_TRUE(kv.free(4));
  EXPECT_EQ(kv.check_invariants(), "");
}

TEST(KvEventHooks, WindowGroupsUseTheChainKeyAndTheirGroup) {
  kv::KvConfig c = kv::testing::make_config(19, 4);  // 18 usable: b below takes every one
  c.groups = {kv::KvGroupSpec{0}, kv::KvGroupSpec{4}};  // full, then a 4-token window
  kv::KvManager kv(c);
  Recorder rec;
  kv.set_event_sink(&rec);
  const auto a = kv::testing::iota_tokens(1, 12);
  ASSERT_TRUE(kv.allocate(1, a, 12, "").ok());
  kv.mark_computed(1, a, 12);
  const auto ka = keys_of(kv, a);
  ASSERT_EQ(rec.stored.size(), 6u);  // 3 blocks x 2 groups
  std::map<std::pair<int32_t, size_t>, const Recorder::Stored*> by;
  for (const auto& s : rec.stored) {
    size_t i = 0;
    while (i < ka.size() && !(ka[i] == s.chain)) ++i;
    ASSERT_LT(i, ka.size()) << "a stored hash that is not a chain key";
    by[{s.group, i}] = &s;
    EXPECT_EQ(s.parent.has_value(), i > 0);
    if (i > 0) {
      EXPECT_EQ(*s.parent, ka[i - 1]);
    }
  }
  EXPECT_EQ(by.size(), 6u);
  EXPECT_EQ(rec.view, cache_view(kv));
  // Decode past the window: the window group releases its early blocks to the
  // free queue (still entries: no event); they leave only when reused.
  const auto a2 = kv::testing::iota_tokens(1, 13);
  ASSERT_TRUE(kv.append_slots(1, 1, nullptr));
  EXPECT_TRUE(rec.removed.empty());
  kv.mark_computed(1, a2, 13);
  EXPECT_EQ(rec.view, cache_view(kv));
  EXPECT_EQ(kv.check_invariants(), "");
  ASSERT_TRUE(kv.free(1));
  // A long other prompt takes every free block: every entry is evicted, each with one event.
  const auto b = kv::testing::iota_tokens(1000, 36);
  rec.reset();
  ASSERT_TRUE(kv.allocate(2, b, 36, "").ok());
  EXPECT_EQ(rec.removed.size(), 6u);
  EXPECT_EQ(rec.view, cache_view(kv));
  EXPECT_TRUE(rec.view.empty());
}

TEST(KvEventHooks, TierImportStoresEveryImportedBlock) {
  kv::KvManager kv(kv::testing::make_config(10, 4));
  Recorder rec;
  kv.set_event_sink(&rec);
  const auto a = kv::testing::iota_tokens(7, 13);  // 3 full blocks a hit may cover
  const int32_t n = kv.import_blocks(a, "", 3, [](int32_t, int32_t) { return true; }, [](int32_t, int32_t, kv::BlockId) {});
  EXPECT_EQ(n, 3);
  const auto ka = keys_of(kv, a);
  ASSERT_EQ(rec.stored.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(rec.stored[i].chain, ka[i]);
  EXPECT_EQ(rec.view, cache_view(kv));
}

// ---- publisher sockets ----
std::string recv_frame(void* s, bool* more) {
  zmq_msg_t m;
  zmq_msg_init(&m);
  if (zmq_msg_recv(&m, s, 0) < 0) {
    zmq_msg_close(&m);
    *more = false;
    return "<timeout>";
  }
  std::string out(static_cast<const char*>(zmq_msg_data(&m)), zmq_msg_size(&m));
  *more = zmq_msg_more(&m);
  zmq_msg_close(&m);
  return out;
}

uint64_t be64(const std::string& s) {
  uint64_t v = 0;
  for (unsigned char c : s) v = v << 8 | c;
  return v;
}

std::string be64_str(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 7; i >= 0; --i, v >>= 8) s[static_cast<size_t>(i)] = static_cast<char>(v & 0xff);
  return s;
}

TEST(KvEventsPublisher, PublishesNumberedMessagesAndReplaysFromASequence) {
  const std::string dir = "/tmp/pagoda_kv_events_" + std::to_string(getpid());
  kv_events::KvEventsConfig cfg;
  cfg.enable_kv_cache_events = true;
  cfg.publisher = "zmq";
  cfg.endpoint = "ipc://" + dir + "_pub";
  cfg.replay_endpoint = "ipc://" + dir + "_replay";
  cfg.topic = "kv-events";
  cfg.buffer_steps = 3;
  auto pub = kv_events::Publisher::start(cfg);
  ASSERT_TRUE(pub.ok()) << pub.message();
  void* ctx = zmq_ctx_new();
  void* sub = zmq_socket(ctx, ZMQ_SUB);
  const int timeout = 5000, linger = 0;
  zmq_setsockopt(sub, ZMQ_RCVTIMEO, &timeout, sizeof(timeout));
  zmq_setsockopt(sub, ZMQ_LINGER, &linger, sizeof(linger));
  zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "", 0);
  ASSERT_EQ(zmq_connect(sub, cfg.endpoint.c_str()), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the subscription reaches the PUB socket
  const std::vector<int32_t> toks = {1, 2};
  for (uint64_t i = 0; i < 5; ++i) {
    EventBatch b;
    b.stored(100 + i, std::nullopt, toks, 2, "cpu", 0);
    (*pub)->publish(b.take());
  }
  (*pub)->publish({});  // empty: no message, no sequence number
  (*pub)->flush();
  for (uint64_t i = 0; i < 5; ++i) {
    bool more = false;
    EXPECT_EQ(recv_frame(sub, &more), "kv-events");
    ASSERT_TRUE(more);
    EXPECT_EQ(be64(recv_frame(sub, &more)), i);
    ASSERT_TRUE(more);
    double ts = 0;
    int64_t rank = 0;
    const auto ev = decode(recv_frame(sub, &more), &ts, &rank);
    EXPECT_FALSE(more);
    ASSERT_EQ(ev.size(), 1u);
    EXPECT_EQ(ev[0].block_hashes, std::vector<uint64_t>{100 + i});
    EXPECT_GT(ts, 1.6e9);
  }
  EXPECT_EQ((*pub)->stats().batches_published, 5);
  EXPECT_EQ((*pub)->stats().events_published, 5);
  // Replay from 3: the buffer keeps the last 3 (2, 3, 4); answers 3, 4, then the end marker.
  void* dealer = zmq_socket(ctx, ZMQ_DEALER);
  zmq_setsockopt(dealer, ZMQ_RCVTIMEO, &timeout, sizeof(timeout));
  zmq_setsockopt(dealer, ZMQ_LINGER, &linger, sizeof(linger));
  ASSERT_EQ(zmq_connect(dealer, cfg.replay_endpoint.c_str()), 0);
  auto ask = [&](uint64_t start) {
    const std::string s = be64_str(start);
    zmq_send(dealer, "", 0, ZMQ_SNDMORE);
    zmq_send(dealer, s.data(), 8, 0);
    std::vector<uint64_t> seqs;
    for (;;) {
      bool more = false;
      EXPECT_EQ(recv_frame(dealer, &more), "");
      if (!more) return seqs;
      const std::string seq = recv_frame(dealer, &more);
      const std::string payload = recv_frame(dealer, &more);
      if (seq == std::string(8, '\xff')) {
        EXPECT_EQ(payload, "");
        return seqs;
      }
      double ts = 0;
      int64_t rank = 0;
      const auto ev = decode(payload, &ts, &rank);
      EXPECT_EQ(ev.at(0).block_hashes.at(0), 100 + be64(seq));
      seqs.push_back(be64(seq));
    }
  };
  EXPECT_EQ(ask(3), (std::vector<uint64_t>{3, 4}));
  EXPECT_EQ(ask(0), (std::vector<uint64_t>{2, 3, 4})) << "older ones left the buffer";
  EXPECT_EQ(ask(9), (std::vector<uint64_t>{}));
  zmq_close(dealer);
  zmq_close(sub);
  zmq_ctx_term(ctx);
}

TEST(KvEventsConfig, ParsesVllmKeysAndRefusesBadOnes) {
  auto c = kv_events::KvEventsConfig::parse(
      R"({"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557",
          "replay_endpoint": "tcp://*:5558", "topic": "kv-events", "buffer_steps": 10000, "hwm": 100000})");
  ASSERT_TRUE(c.ok()) << c.message();
  EXPECT_TRUE(c->enabled());
  EXPECT_EQ(c->endpoint, "tcp://*:5557");
  EXPECT_EQ(c->replay_endpoint, "tcp://*:5558");
  EXPECT_EQ(c->topic, "kv-events");
  EXPECT_EQ(c->buffer_steps, 10000);
  EXPECT_EQ(c->hwm, 100000);
  auto off = kv_events::KvEventsConfig::parse(R"({"enable_kv_cache_events": true, "publisher": "null"})");
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->enabled());
  EXPECT_FALSE(kv_events::KvEventsConfig::parse(R"({"publisher": "zmq"})")->enabled()) << "enable defaults to false";
  auto expect_err = [](const char* text, const char* needle) {
    auto r = kv_events::KvEventsConfig::parse(text);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.message().find(needle), std::string::npos) << r.message();
  };
  expect_err("{", "not valid JSON");
  expect_err("[]", "JSON object");
  expect_err(R"({"publisher": "kafka"})", "unknown publisher \"kafka\"");
  expect_err(R"({"endpont": "x"})", "unknown key \"endpont\"");
  expect_err(R"({"hwm": "big"})", "\"hwm\" must be an integer");
  expect_err(R"({"buffer_steps": 0})", "\"buffer_steps\"");
  expect_err(R"({"enable_kv_cache_events": 1})", "\"enable_kv_cache_events\"");
}

}  // namespace
}  // namespace pagoda
