// Tier entry encode/verify and the Redis helpers (URL, key slot).
#include <gtest/gtest.h>

#include "tier/entry.h"
#include "tier/redis_tier.h"
#include "tier_test_util.h"

namespace pagoda::tier {
namespace {

using tiertest::test_bytes;
using tiertest::test_key;

const std::vector<int32_t> kTokens = {5, 6, 7, 8};

TEST(TierEntry, RoundTrip) {
  const TierKey k = test_key(42, "tenant");
  const std::string kv = test_bytes(1000, 3);
  const std::string blob = encode_entry(k, kTokens, kv);
  std::string out;
  ASSERT_EQ(decode_entry(blob, k, kTokens, kv.size(), &out), DecodeResult::kOk);
  EXPECT_EQ(out, kv);
}

TEST(TierEntry, EveryFlippedByteIsCorrupt) {
  const TierKey k = test_key(42, "s");
  const std::string blob = encode_entry(k, kTokens, test_bytes(200, 1));
  for (size_t i = 0; i < blob.size(); ++i) {
    std::string bad = blob;
    bad[i] = static_cast<char>(bad[i] ^ 0x10);
    std::string out;
    EXPECT_EQ(decode_entry(bad, k, kTokens, 200, &out), DecodeResult::kCorrupt) << "byte " << i;
    EXPECT_TRUE(out.empty());
  }
}

TEST(TierEntry, TornEntryIsCorrupt) {
  const TierKey k = test_key(42);
  const std::string blob = encode_entry(k, kTokens, test_bytes(200, 1));
  for (size_t len : {size_t{0}, size_t{10}, size_t{64}, blob.size() / 2, blob.size() - 1}) {
    std::string out;
    EXPECT_EQ(decode_entry(std::string_view(blob).substr(0, len), k, kTokens, 200, &out), DecodeResult::kCorrupt)
        << len;
  }
  std::string longer = blob;
  longer.push_back('x');
  std::string out;
  EXPECT_EQ(decode_entry(longer, k, kTokens, 200, &out), DecodeResult::kCorrupt);
}

TEST(TierEntry, OtherKeyFieldsOrTokensAreMismatches) {
  const TierKey k = test_key(42, "a");
  const std::string blob = encode_entry(k, kTokens, test_bytes(64, 1));
  std::string out;
  TierKey other = k;
  other.model_fingerprint ^= 1;
  EXPECT_EQ(decode_entry(blob, other, kTokens, 64, &out), DecodeResult::kMismatch);
  other = test_key(42, "b");  // (not `other.cache_salt = "b"`: gcc 12 warns wrongly on it)
  EXPECT_EQ(decode_entry(blob, other, kTokens, 64, &out), DecodeResult::kMismatch);
  other = k;
  other.kv_dtype = 0;
  EXPECT_EQ(decode_entry(blob, other, kTokens, 64, &out), DecodeResult::kMismatch);
  other = k;
  other.block_size = 8;
  EXPECT_EQ(decode_entry(blob, other, kTokens, 64, &out), DecodeResult::kMismatch);
  other = k;
  other.group = 1;
  EXPECT_EQ(decode_entry(blob, other, kTokens, 64, &out), DecodeResult::kMismatch);
  other = k;
  other.chain.hi ^= 1;
  EXPECT_EQ(decode_entry(blob, other, kTokens, 64, &out), DecodeResult::kMismatch);
  EXPECT_EQ(decode_entry(blob, k, std::vector<int32_t>{5, 6, 7, 9}, 64, &out), DecodeResult::kMismatch);
  EXPECT_EQ(decode_entry(blob, k, kTokens, 65, &out), DecodeResult::kMismatch);
  EXPECT_TRUE(out.empty());
}

TEST(TierEntry, NameCoversEveryKeyField) {
  const TierKey k = test_key(42, "a");
  EXPECT_EQ(k.name().size(), 32u);
  EXPECT_EQ(k.name(), test_key(42, "a").name());
  // Each key differs from k in one field.
  const auto differs = [&](auto change) {
    TierKey o = k;
    change(o);
    return o.name() != k.name();
  };
  EXPECT_TRUE(differs([](TierKey& o) { o.model_fingerprint ^= 1; }));
  EXPECT_TRUE(differs([](TierKey& o) { o.kv_dtype = 2; }));
  EXPECT_TRUE(differs([](TierKey& o) { o.block_size = 16; }));
  EXPECT_TRUE(differs([](TierKey& o) { o.group = 1; }));
  EXPECT_TRUE(differs([](TierKey& o) { o.cache_salt = test_key(0, "b").cache_salt; }));
  EXPECT_TRUE(differs([](TierKey& o) { o.chain.lo ^= 1; }));
}

TEST(RedisHelpers, KeySlotMatchesRedisCluster) {
  // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
  EXPECT_EQ(redis_key_slot("123456789"), 0x31C3 % 16384);
  EXPECT_EQ(redis_key_slot("foo"), 12182);
  EXPECT_EQ(redis_key_slot("{user1000}.following"), redis_key_slot("user1000"));
  EXPECT_EQ(redis_key_slot("foo{}{bar}"), redis_key_slot("foo{}{bar}"));  // empty tag: whole key
  EXPECT_NE(redis_key_slot("foo{}{bar}"), redis_key_slot("bar"));
}

TEST(RedisHelpers, ParseUrl) {
  auto one = parse_redis_url("redis://127.0.0.1:6379");
  ASSERT_TRUE(one.ok()) << one.message();
  ASSERT_EQ(one->size(), 1u);
  EXPECT_EQ((*one)[0].first, "127.0.0.1");
  EXPECT_EQ((*one)[0].second, 6379);
  auto three = parse_redis_url("redis://a:1,b:2,localhost:30003");
  ASSERT_TRUE(three.ok()) << three.message();
  ASSERT_EQ(three->size(), 3u);
  EXPECT_EQ((*three)[2].first, "localhost");
  EXPECT_EQ((*three)[2].second, 30003);
  for (const char* bad : {"redis://", "redis://host", "redis://host:0", "redis://host:70000", "redis://:80",
                          "redis://a:1,,b:2", "redis://a:x"}) {
    EXPECT_FALSE(parse_redis_url(bad).ok()) << bad;
  }
}

}  // namespace
}  // namespace pagoda::tier
