// The router's routing arithmetic (src/router/ring.*), its replica URL parser and
// the prompt it routes on (src/router/prompt.*).
#include <gtest/gtest.h>

#include <map>

#include "base/hash.h"
#include "gguf/gguf.h"
#include "router/prompt.h"
#include "router/ring.h"
#include "router/upstream.h"
#include "tok/tokenizer.h"

namespace pagoda::router {
namespace {

std::vector<int32_t> iota_tokens(int n, int32_t start = 1) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = start + i;
  return t;
}

TEST(PrefixKey, ChainsWholeBlocksUpToTheLimit) {
  EXPECT_FALSE(prefix_key({}, 16, 4).has_value());
  EXPECT_FALSE(prefix_key(iota_tokens(15), 16, 4).has_value());  // no whole block
  // The chain, spelled out: block b hashed with block b-1's hash as the seed.
  const auto t = iota_tokens(40);
  uint64_t h = 0x70616730646121ull;
  h = xxh3_64(t.data(), 16 * sizeof(int32_t), h);
  EXPECT_EQ(*prefix_key(t, 16, 1), h);
  h = xxh3_64(t.data() + 16, 16 * sizeof(int32_t), h);
  EXPECT_EQ(*prefix_key(t, 16, 4), h);  // 40 tokens: 2 whole blocks, the tail is not hashed
  EXPECT_EQ(*prefix_key(t, 16, 2), h);
}

TEST(PrefixKey, EqualExactlyWhenTheKeyedBlocksAreEqual) {
  auto a = iota_tokens(100);
  auto b = a;
  b[99] = 7;  // beyond 4 blocks of 16: same key
  b[70] = 7;
  EXPECT_EQ(prefix_key(a, 16, 4), prefix_key(b, 16, 4));
  b[63] = 7;  // the last token of block 3
  EXPECT_NE(prefix_key(a, 16, 4), prefix_key(b, 16, 4));
  auto c = a;
  c[0] = 9;  // the first token
  EXPECT_NE(prefix_key(a, 16, 4), prefix_key(c, 16, 4));
  // Swapping two blocks changes the key (a chain, not a set of blocks).
  auto d = a;
  std::swap_ranges(d.begin(), d.begin() + 16, d.begin() + 16);
  EXPECT_NE(prefix_key(a, 16, 4), prefix_key(d, 16, 4));
  // A prompt with fewer whole blocks than the limit is keyed by those it has.
  EXPECT_EQ(prefix_key(iota_tokens(33), 16, 4), prefix_key(iota_tokens(47), 16, 4));
  EXPECT_NE(prefix_key(iota_tokens(32), 16, 4), prefix_key(iota_tokens(48), 16, 4));
}

TEST(HashRing, WalkVisitsEveryReplicaOnceAndIsDeterministic) {
  HashRing ring({"http://a:1", "http://b:2", "http://c:3"});
  HashRing again({"http://a:1", "http://b:2", "http://c:3"});
  for (uint64_t k : {0ull, 1ull, 0x8000000000000000ull, ~0ull, 12345678901234ull}) {
    auto w = ring.walk(k);
    ASSERT_EQ(w.size(), 3u);
    std::vector<int> sorted = w;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, (std::vector<int>{0, 1, 2}));
    EXPECT_EQ(w, again.walk(k));
  }
}

TEST(HashRing, SkippingAReplicaMovesOnlyItsKeys) {
  // Skipping c on the full ring routes exactly as a ring built without c, and a
  // key that c did not own keeps its owner.
  HashRing abc({"http://a:1", "http://b:2", "http://c:3"});
  HashRing ab({"http://a:1", "http://b:2"});
  const std::vector<bool> no_c = {true, true, false};
  const std::vector<int> idle = {0, 0, 0};
  int moved = 0;
  for (uint64_t i = 0; i < 3000; ++i) {
    const uint64_t key = xxh3_64(&i, sizeof(i));
    const int owner = abc.walk(key)[0];
    const RouteChoice skip = choose_affinity(abc, key, idle, no_c, 0.5);
    EXPECT_EQ(skip.replica, ab.walk(key)[0]);
    EXPECT_EQ(skip.kind, RouteKind::kAffinity);
    if (owner != 2) {
      EXPECT_EQ(skip.replica, owner);
    }
    moved += owner == 2;
  }
  // c owned about a third of the keys (160 virtual nodes each).
  EXPECT_GT(moved, 700);
  EXPECT_LT(moved, 1300);
}

TEST(HashRing, VirtualNodesSpreadKeys) {
  HashRing ring({"http://127.0.0.1:8001", "http://127.0.0.1:8002"});
  int first = 0;
  for (uint64_t i = 0; i < 10000; ++i) {
    const uint64_t key = xxh3_64(&i, sizeof(i));
    first += ring.walk(key)[0] == 0;
  }
  EXPECT_GT(first, 3500);
  EXPECT_LT(first, 6500);
}

TEST(BoundedLoad, LimitIsOnePlusImbalanceTimesMeanPlusOne) {
  EXPECT_DOUBLE_EQ(load_limit({3, 1}, {true, true}, 0.5), 4.0);     // mean 2
  EXPECT_DOUBLE_EQ(load_limit({3, 1, 8}, {true, true, false}, 0.5), 4.0);  // ineligible not in the mean
  EXPECT_DOUBLE_EQ(load_limit({0, 0}, {true, true}, 0.25), 1.0);
  EXPECT_DOUBLE_EQ(load_limit({}, {}, 0.5), 1.0);
}

TEST(BoundedLoad, OwnerOverTheLimitPassesToTheNextOnTheRing) {
  HashRing ring({"http://a:1", "http://b:2", "http://c:3"});
  const uint64_t key = 42;
  const auto w = ring.walk(key);
  const size_t owner = static_cast<size_t>(w[0]), second = static_cast<size_t>(w[1]),
               third = static_cast<size_t>(w[2]);
  const std::vector<bool> all = {true, true, true};
  std::vector<int> load(3, 0);
  // Idle: the owner.
  RouteChoice c = choose_affinity(ring, key, load, all, 0.5);
  EXPECT_EQ(c.replica, w[0]);
  EXPECT_EQ(c.kind, RouteKind::kAffinity);
  // Loads (owner, second, third), mean m, limit 1.5m + 1: the owner takes the
  // request while its load is at most the limit.
  load[owner] = 2;
  load[second] = 1;
  load[third] = 0;  // mean 1, limit 2.5
  c = choose_affinity(ring, key, load, all, 0.5);
  EXPECT_EQ(c.replica, w[0]);
  load[owner] = 3;  // mean 4/3, limit 3: exactly at the limit still takes it
  c = choose_affinity(ring, key, load, all, 0.5);
  EXPECT_EQ(c.replica, w[0]);
  EXPECT_EQ(c.kind, RouteKind::kAffinity);
  load[owner] = 4;  // mean 5/3, limit 3.5: the owner is over, the second is not
  c = choose_affinity(ring, key, load, all, 0.5);
  EXPECT_EQ(c.replica, w[1]);
  EXPECT_EQ(c.kind, RouteKind::kFallback);
  load[second] = 6;  // mean 10/3, limit 6: owner 4 is within again
  c = choose_affinity(ring, key, load, all, 0.5);
  EXPECT_EQ(c.replica, w[0]);
  load[owner] = 9;  // mean 5, limit 8.5: owner over, second (6) within
  c = choose_affinity(ring, key, load, all, 0.5);
  EXPECT_EQ(c.replica, w[1]);
  load[second] = 20;  // mean 29/3, limit 15.5: owner 9 within
  c = choose_affinity(ring, key, load, all, 0.5);
  EXPECT_EQ(c.replica, w[0]);
  // With max_imbalance 0 (limit mean + 1) two can be over: 30, 30, 0 -> mean 20, limit 21.
  load[owner] = 30;
  load[second] = 30;
  c = choose_affinity(ring, key, load, all, 0.0);
  EXPECT_EQ(c.replica, w[2]);
  EXPECT_EQ(c.kind, RouteKind::kFallback);
  // No eligible replica: none.
  EXPECT_EQ(choose_affinity(ring, key, load, {false, false, false}, 0.5).replica, -1);
}

TEST(BoundedLoad, TheLeastLoadedIsAlwaysWithinTheLimit) {
  // Whatever the loads, some eligible replica is chosen (the least loaded is <= the mean).
  HashRing ring({"a", "b", "c", "d"});
  uint64_t s = 1;
  for (int it = 0; it < 2000; ++it) {
    std::vector<int> load(4);
    std::vector<bool> ok(4);
    bool any = false;
    for (size_t r = 0; r < 4; ++r) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      load[r] = static_cast<int>((s >> 33) % 50);
      ok[r] = (s >> 20) % 4 != 0;
      any |= ok[r];
    }
    const RouteChoice c = choose_affinity(ring, s, load, ok, 0.0);
    if (!any) {
      EXPECT_EQ(c.replica, -1);
      continue;
    }
    ASSERT_GE(c.replica, 0);
    EXPECT_TRUE(ok[static_cast<size_t>(c.replica)]);
    EXPECT_LE(load[static_cast<size_t>(c.replica)], load_limit(load, ok, 0.0));
  }
}

TEST(LeastLoaded, FewestInFlightTiesRotate) {
  EXPECT_EQ(choose_least_loaded({3, 1, 2}, {true, true, true}, 0).replica, 1);
  EXPECT_EQ(choose_least_loaded({3, 1, 2}, {true, false, true}, 0).replica, 2);
  EXPECT_EQ(choose_least_loaded({0, 0, 0}, {true, true, true}, 0).replica, 0);
  EXPECT_EQ(choose_least_loaded({0, 0, 0}, {true, true, true}, 1).replica, 1);
  EXPECT_EQ(choose_least_loaded({0, 0, 0}, {true, true, true}, 5).replica, 2);
  EXPECT_EQ(choose_least_loaded({0, 0}, {false, false}, 0).replica, -1);
  EXPECT_EQ(choose_least_loaded({0, 0}, {true, true}, 0).kind, RouteKind::kLeastLoaded);
}

TEST(RoundRobin, TakesTurnsSkippingIneligible) {
  std::vector<int> seen;
  for (uint64_t t = 0; t < 6; ++t) seen.push_back(choose_round_robin({true, false, true}, t).replica);
  EXPECT_EQ(seen, (std::vector<int>{0, 2, 2, 0, 2, 2}));
  EXPECT_EQ(choose_round_robin({false, false}, 3).replica, -1);
}

TEST(ReplicaUrl, ParsesAndNormalizes) {
  auto u = parse_replica_url("http://127.0.0.1:8001");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->host, "127.0.0.1");
  EXPECT_EQ(u->port, "8001");
  EXPECT_EQ(u->base_path, "");
  EXPECT_EQ(u->text, "http://127.0.0.1:8001");
  u = parse_replica_url("http://host/proxy/v1/");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->port, "80");
  EXPECT_EQ(u->base_path, "/proxy");
  EXPECT_EQ(u->text, "http://host:80/proxy");
  u = parse_replica_url("http://[::1]:9000");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->host, "::1");
  EXPECT_EQ(u->text, "http://[::1]:9000");
  for (const char* bad : {"127.0.0.1:8001", "https://h:1", "http://:80", "http://h:", "http://h:0", "http://h:65536",
                          "http://h:8x", "http://[::1"}) {
    EXPECT_FALSE(parse_replica_url(bad).ok()) << bad;
  }
}

class RoutingPrompt : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto file = gguf::GgufFile::open(std::string(PAGODA_TEST_DATA) + "/stories260K.gguf");
    ASSERT_TRUE(file.ok());
    auto tk = tok::Tokenizer::from_gguf(**file);
    ASSERT_TRUE(tk.ok());
    auto c = server::TextCodec::create(**tk);
    ASSERT_TRUE(c.ok());
    codec_ = std::move(c).value().release();
  }
  static void TearDownTestSuite() { delete codec_; }
  static server::TextCodec* codec_;
};
server::TextCodec* RoutingPrompt::codec_ = nullptr;

TEST_F(RoutingPrompt, ReadsPromptsAsServeDoes) {
  using server::Endpoint;
  // Token ids: as given (the first prompt of a batch).
  EXPECT_EQ(routing_prompt(Endpoint::kCompletions, R"({"prompt": [1, 5, 9]})", codec_),
            (std::vector<int32_t>{1, 5, 9}));
  EXPECT_EQ(routing_prompt(Endpoint::kCompletions, R"({"prompt": [[4, 2], [7]]})", nullptr),
            (std::vector<int32_t>{4, 2}));
  // Text: serve's encoding (BOS, no control-token parsing).
  const auto want = codec_->encode_prompt("Once upon a time", true, false);
  ASSERT_GT(want.size(), 2u);
  EXPECT_EQ(routing_prompt(Endpoint::kCompletions, R"({"prompt": "Once upon a time", "stream": true})", codec_), want);
  EXPECT_EQ(routing_prompt(Endpoint::kCompletions, R"({"prompt": ["Once upon a time", "x"]})", codec_), want);
  // No tokenizer, a malformed body, or a model without a chat template: nothing to route on.
  EXPECT_TRUE(routing_prompt(Endpoint::kCompletions, R"({"prompt": "Once upon a time"})", nullptr).empty());
  EXPECT_TRUE(routing_prompt(Endpoint::kCompletions, R"({"prompt": )", codec_).empty());
  EXPECT_TRUE(routing_prompt(Endpoint::kCompletions, R"({"prompt": "a", "max_tokens": -3})", codec_).empty());
  EXPECT_TRUE(
      routing_prompt(Endpoint::kChat, R"({"messages": [{"role": "user", "content": "hi"}]})", codec_).empty());
}

}  // namespace
}  // namespace pagoda::router
