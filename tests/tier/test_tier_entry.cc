// The tier entry's crypto (RFC 4231, SP 800-38A vectors), encode/verify
// (keyed names, no plain tokens or salt, forged, swapped, torn, flipped and
// old entries), and the Redis helpers (URL, key slot).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>

#include "tier/crypto.h"
#include "tier/entry.h"
#include "tier/redis_tier.h"
#include "tier_test_util.h"

namespace pagoda::tier {
namespace {

using tiertest::test_bytes;
using tiertest::test_key;

const std::vector<int32_t> kTokens = {5, 6, 7, 8};
const EntryCodec kCodec("the deployment's secret");

std::string unhex(std::string_view h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) out.push_back(static_cast<char>(std::stoi(std::string(h.substr(i, 2)), nullptr, 16)));
  return out;
}

std::string hex(const Digest256& d) {
  std::string out;
  char buf[3];
  for (uint8_t b : d) {
    std::snprintf(buf, sizeof buf, "%02x", b);
    out += buf;
  }
  return out;
}

// RFC 4231's HMAC-SHA256 test cases 1, 2, 3, 4, 6 and 7 (5 is a truncated output).
TEST(TierCrypto, HmacSha256MatchesRfc4231) {
  EXPECT_EQ(hex(hmac_sha256(std::string(20, '\x0b'), "Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(hex(hmac_sha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_EQ(hex(hmac_sha256(std::string(20, '\xaa'), std::string(50, '\xdd'))),
            "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
  EXPECT_EQ(hex(hmac_sha256(unhex("0102030405060708090a0b0c0d0e0f10111213141516171819"), std::string(50, '\xcd'))),
            "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
  EXPECT_EQ(hex(hmac_sha256(std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First")),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  const std::string tc7 =
      "This is a test using a larger than block-size key and a larger than block-size data. The key needs to be "
      "hashed before being used by the HMAC algorithm.";
  EXPECT_EQ(hex(hmac_sha256(std::string(131, '\xaa'), tc7)),
            "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
  // Incremental updates give the one-shot digest.
  HmacSha256 h(std::string(131, '\xaa'));
  h.update(tc7.substr(0, 7));
  h.update(tc7.substr(7));
  EXPECT_EQ(hex(h.final()), "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
}

// NIST SP 800-38A F.5.5 (CTR-AES256.Encrypt), and decryption is the same call.
TEST(TierCrypto, Aes256CtrMatchesSp80038a) {
  const std::string key = unhex("603deb1015ca71be2b73aef0857d77811f352c073b6108d72d9810a30914dff4");
  const std::string iv = unhex("f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff");
  const std::string plain = unhex(
      "6bc1bee22e409f96e93d7e117393172aae2d8a571e03ac9c9eb76fac45af8e51"
      "30c81c46a35ce411e5fbc1191a0a52eff69f2445df4f9b17ad2b417be66c3710");
  const std::string want = unhex(
      "601ec313775789a5b7a7f504bbf3d228f443e3ca4d62b59aca84e990cacaf5c5"
      "2b0930daa23de94ce87017ba2d84988ddfc9c58db67aada613c2dd08457941a6");
  const auto* k = reinterpret_cast<const uint8_t*>(key.data());
  const auto* v = reinterpret_cast<const uint8_t*>(iv.data());
  std::string out(plain.size(), '\0');
  aes256_ctr(k, v, plain.data(), plain.size(), out.data());
  EXPECT_EQ(out, want);
  std::string back(out.size(), '\0');
  aes256_ctr(k, v, out.data(), out.size(), back.data());
  EXPECT_EQ(back, plain);
}

TEST(TierEntry, RoundTrip) {
  const TierKey k = test_key(42, "tenant");
  const std::string kv = test_bytes(1000, 3);
  const std::string blob = kCodec.encode(k, kTokens, kv);
  EXPECT_EQ(blob.size(), EntryCodec::entry_size(kv.size(), kTokens.size()));
  // Header 72, meta 40 + 4 per token and its MAC 32, the K/V, the MAC 32.
  EXPECT_EQ(EntryCodec::entry_size(kv.size(), kTokens.size()), kv.size() + 72 + 40 + 4 * kTokens.size() + 64);
  EXPECT_EQ(EntryCodec::head_size(kTokens.size()), 72 + 40 + 4 * kTokens.size() + 32);
  std::string out;
  ASSERT_EQ(kCodec.decode(blob, k, kTokens, kv.size(), &out), DecodeResult::kOk);
  EXPECT_EQ(out, kv);
  // A second encoding of the same block: another IV, other bytes, the same content.
  const std::string again = kCodec.encode(k, kTokens, kv);
  EXPECT_NE(again, blob);
  ASSERT_EQ(kCodec.decode(again, k, kTokens, kv.size(), &out), DecodeResult::kOk);
  EXPECT_EQ(out, kv);
}

// What a reader of the store sees: no token ids, no salt (tenant tag), no K/V
// bytes in plain form.
TEST(TierEntry, HoldsNoPlainTokensSaltOrKv) {
  const std::string salt = "0123456789abcdef0123456789abcdef/user";
  const TierKey k = test_key(42, salt);
  const std::vector<int32_t> tokens = {1000001, 1000002, 1000003, 1000004};
  const std::string kv = test_bytes(4096, 5);
  const std::string blob = kCodec.encode(k, tokens, kv);
  const std::string tok_bytes(reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(int32_t));
  EXPECT_EQ(blob.find(tok_bytes), std::string::npos);
  EXPECT_EQ(blob.find(tok_bytes.substr(0, 4)), std::string::npos);  // not even one token id
  EXPECT_EQ(blob.find(salt.substr(0, 8)), std::string::npos);
  EXPECT_EQ(blob.find(kv.substr(100, 16)), std::string::npos);
}

TEST(TierEntry, EveryFlippedByteIsCorrupt) {
  const TierKey k = test_key(42, "s");
  const std::string blob = kCodec.encode(k, kTokens, test_bytes(200, 1));
  for (size_t i = 0; i < blob.size(); ++i) {
    std::string bad = blob;
    bad[i] = static_cast<char>(bad[i] ^ 0x10);
    std::string out = "x";
    const DecodeResult r = kCodec.decode(bad, k, kTokens, 200, &out);
    // Bytes 4..7 are the version: a flip there is another format (ignored, not
    // misread); 16..23 the expiry, outside the MACs (entry.h): the same K/V.
    const bool expiry = i >= EntryCodec::kExpiryOffset && i < EntryCodec::kExpiryOffset + 8;
    EXPECT_EQ(r, i >= 4 && i < 8 ? DecodeResult::kMismatch : expiry ? DecodeResult::kOk : DecodeResult::kCorrupt)
        << "byte " << i;
    EXPECT_EQ(out.empty(), !expiry) << "byte " << i;
  }
}

TEST(TierEntry, TornOrLongerEntryIsCorrupt) {
  const TierKey k = test_key(42);
  const std::string blob = kCodec.encode(k, kTokens, test_bytes(200, 1));
  for (size_t len : {size_t{0}, size_t{7}, size_t{10}, size_t{64}, blob.size() / 2, blob.size() - 1}) {
    std::string out;
    EXPECT_EQ(kCodec.decode(std::string_view(blob).substr(0, len), k, kTokens, 200, &out), DecodeResult::kCorrupt)
        << len;
  }
  std::string longer = blob;
  longer.push_back('x');
  std::string out;
  EXPECT_EQ(kCodec.decode(longer, k, kTokens, 200, &out), DecodeResult::kCorrupt);
}

// An entry read under another key (a swapped or renamed entry: another
// tenant's, model's, block's) or for other tokens fails the MAC: corrupt.
TEST(TierEntry, OtherKeyFieldsOrTokensAreCorrupt) {
  const TierKey k = test_key(42, "a");
  const std::string blob = kCodec.encode(k, kTokens, test_bytes(64, 1));
  std::string out;
  const auto corrupt_under = [&](auto change) {
    TierKey o = k;
    change(o);
    return kCodec.decode(blob, o, kTokens, 64, &out) == DecodeResult::kCorrupt;
  };
  EXPECT_TRUE(corrupt_under([](TierKey& o) { o.model_fingerprint ^= 1; }));
  EXPECT_TRUE(corrupt_under([](TierKey& o) { o = test_key(42, "b"); }));
  EXPECT_TRUE(corrupt_under([](TierKey& o) { o = test_key(42, std::string(2, 'a')); }));
  EXPECT_TRUE(corrupt_under([](TierKey& o) { o.kv_dtype = 0; }));
  EXPECT_TRUE(corrupt_under([](TierKey& o) { o.block_size = 8; }));
  EXPECT_TRUE(corrupt_under([](TierKey& o) { o.group = 1; }));
  EXPECT_TRUE(corrupt_under([](TierKey& o) { o.chain.hi ^= 1; }));
  EXPECT_EQ(kCodec.decode(blob, k, std::vector<int32_t>{5, 6, 7, 9}, 64, &out), DecodeResult::kCorrupt);
  EXPECT_EQ(kCodec.decode(blob, k, std::vector<int32_t>{5, 6, 7}, 64, &out), DecodeResult::kCorrupt);
  EXPECT_EQ(kCodec.decode(blob, k, kTokens, 65, &out), DecodeResult::kCorrupt);
  EXPECT_TRUE(out.empty());
  ASSERT_EQ(kCodec.decode(blob, k, kTokens, 64, &out), DecodeResult::kOk);
}

// Whoever can write the store but lacks the secret cannot make an entry that
// is served: one made under another secret (or none) is corrupt, whatever it holds.
TEST(TierEntry, AnEntryForgedWithoutTheSecretIsCorrupt) {
  const TierKey k = test_key(42, "victim-tenant");
  const std::string kv = test_bytes(256, 7);
  for (const EntryCodec& forger : {EntryCodec(""), EntryCodec("a guessed secret!")}) {
    const std::string forged = forger.encode(k, kTokens, kv);
    std::string out;
    EXPECT_EQ(kCodec.decode(forged, k, kTokens, kv.size(), &out), DecodeResult::kCorrupt);
    EXPECT_EQ(forger.decode(forged, k, kTokens, kv.size(), &out), DecodeResult::kOk);  // its own secret reads it
  }
}

// A version 1 entry (plain salt and tokens, an XXH3 checksum) is ignored, not misread.
TEST(TierEntry, AnOldVersionIsAMismatch) {
  std::string v1(64 + 4 * 4 + 64 + 8, '\0');
  const uint32_t magic = 0x564b4750, version = 1;
  std::memcpy(v1.data(), &magic, 4);
  std::memcpy(v1.data() + 4, &version, 4);
  std::string out;
  EXPECT_EQ(kCodec.decode(v1, test_key(42), kTokens, 64, &out), DecodeResult::kMismatch);
  v1.resize(EntryCodec::entry_size(64, kTokens.size()));  // even with the size of a version 3 entry
  EXPECT_EQ(kCodec.decode(v1, test_key(42), kTokens, 64, &out), DecodeResult::kMismatch);
  EXPECT_TRUE(out.empty());
}

// Version 3 (issues 36, 37): the expiry and the namespace in plain header
// fields; the meta (chain, parent, tokens) encrypted, readable from the head
// alone, bound to the entry's name and the secret.
TEST(TierEntry, HeadCarriesExpiryNamespaceAndMeta) {
  const TierKey k = test_key(42, "tenant");
  const Hash128 parent{7, 9};
  const std::vector<int32_t> tokens = {1000001, 1000002, 1000003, 1000004};
  const std::string blob = kCodec.encode(k, tokens, test_bytes(300, 2), &parent, 1234567890123ull);
  const EntryHead h = EntryCodec::parse_head(blob);
  EXPECT_TRUE(h.ours);
  EXPECT_EQ(h.expiry_ms, 1234567890123ull);
  EXPECT_EQ(h.ns, kCodec.namespace_tag(k));
  EXPECT_EQ(kCodec.namespace_tag(test_key(43, "other tenant")), h.ns);  // every salt and block of one engine
  TierKey other_model = k;
  other_model.model_fingerprint ^= 1;
  EXPECT_NE(kCodec.namespace_tag(other_model), h.ns);
  TierKey other_block_size = k;
  other_block_size.block_size = 16;
  EXPECT_NE(kCodec.namespace_tag(other_block_size), h.ns);
  EXPECT_NE(EntryCodec("another deployment").namespace_tag(k), h.ns);
  const std::string head = blob.substr(0, EntryCodec::head_size(tokens.size()));
  EntryMeta m;
  ASSERT_TRUE(kCodec.decode_meta(kCodec.name(k), head, &m));
  EXPECT_EQ(m.chain, k.chain);
  EXPECT_EQ(m.parent, parent);
  EXPECT_FALSE(m.root);
  EXPECT_EQ(m.group, 0u);
  EXPECT_EQ(m.tokens, tokens);
  // Under another name (a file renamed), another secret, torn, or any byte of it flipped but the expiry: refused.
  EXPECT_FALSE(kCodec.decode_meta(kCodec.name(test_key(43, "tenant")), head, &m));
  EXPECT_FALSE(EntryCodec("x").decode_meta(kCodec.name(k), head, &m));
  EXPECT_FALSE(kCodec.decode_meta(kCodec.name(k), head.substr(0, head.size() - 1), &m));
  for (size_t i = 0; i < head.size(); ++i) {
    std::string bad = head;
    bad[i] = static_cast<char>(bad[i] ^ 0x01);
    const bool expiry = i >= EntryCodec::kExpiryOffset && i < EntryCodec::kExpiryOffset + 8;
    EXPECT_EQ(kCodec.decode_meta(kCodec.name(k), bad, &m), expiry) << "byte " << i;
  }
  // A root block; no expiry.
  const std::string root = kCodec.encode(k, tokens, test_bytes(300, 2));
  EXPECT_EQ(EntryCodec::parse_head(root).expiry_ms, 0u);
  ASSERT_TRUE(kCodec.decode_meta(kCodec.name(k), root, &m));
  EXPECT_TRUE(m.root);
  // A renewed expiry (8 bytes rewritten in place) leaves the entry whole.
  std::string renewed = blob;
  const uint64_t later = 2234567890123ull;
  std::memcpy(renewed.data() + EntryCodec::kExpiryOffset, &later, sizeof(later));
  std::string out;
  EXPECT_EQ(kCodec.decode(renewed, k, tokens, 300, &out), DecodeResult::kOk);
  EXPECT_EQ(out, test_bytes(300, 2));
  EXPECT_EQ(EntryCodec::parse_head(renewed).expiry_ms, later);
}

TEST(TierEntry, NameCoversEveryKeyFieldAndTheSecret) {
  const TierKey k = test_key(42, "a");
  const std::string n = kCodec.name(k);
  EXPECT_EQ(n.size(), 32u);
  EXPECT_EQ(n.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(n, kCodec.name(test_key(42, "a")));
  EXPECT_EQ(n, EntryCodec("the deployment's secret").name(k));  // every replica finds the same names
  EXPECT_NE(n, EntryCodec("another deployment").name(k));
  EXPECT_NE(n, EntryCodec().name(k));
  // Each key differs from k in one field.
  const auto differs = [&](auto change) {
    TierKey o = k;
    change(o);
    return kCodec.name(o) != n;
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

namespace pagoda::tier {
namespace {

// Issue 38: a hybrid model's state checkpoint is an entry of its own kind. The
// kind is part of the name and of both MACs, so one kind is never served as
// the other (even with the same K/V size), the meta says which it is, and a
// block's name is what it was before the field existed (v3 entries stay found).
TEST(TierEntry, ACheckpointIsNeverReadAsABlockNorTheReverse) {
  const TierKey block = test_key(42, "a");
  TierKey ckpt = block;
  ckpt.kind = TierKey::kCheckpoint;
  EXPECT_NE(kCodec.name(block), kCodec.name(ckpt));
  EXPECT_EQ(kCodec.namespace_tag(block), kCodec.namespace_tag(ckpt));  // one engine's entries: a reset clears both
  const std::string kv = test_bytes(64, 3);
  const std::string as_ckpt = kCodec.encode(ckpt, kTokens, kv);
  const std::string as_block = kCodec.encode(block, kTokens, kv);
  std::string out;
  EXPECT_EQ(kCodec.decode(as_ckpt, block, kTokens, kv.size(), &out), DecodeResult::kCorrupt);
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(kCodec.decode(as_block, ckpt, kTokens, kv.size(), &out), DecodeResult::kCorrupt);
  EXPECT_TRUE(out.empty());
  ASSERT_EQ(kCodec.decode(as_ckpt, ckpt, kTokens, kv.size(), &out), DecodeResult::kOk);
  EXPECT_EQ(out, kv);
  // The meta says the kind; it is bound to the entry's own name.
  EntryMeta m;
  ASSERT_TRUE(kCodec.decode_meta(kCodec.name(ckpt), as_ckpt, &m));
  EXPECT_EQ(m.kind, TierKey::kCheckpoint);
  EXPECT_EQ(m.chain, ckpt.chain);
  EXPECT_FALSE(kCodec.decode_meta(kCodec.name(block), as_ckpt, &m));
  ASSERT_TRUE(kCodec.decode_meta(kCodec.name(block), as_block, &m));
  EXPECT_EQ(m.kind, TierKey::kBlock);
  // A block's name: HMAC(name key, the seven key words, the salt), as before the kind.
  const auto name_key = hmac_sha256("the deployment's secret", "pagoda kv tier: entry names");
  HmacSha256 h(std::string_view(reinterpret_cast<const char*>(name_key.data()), name_key.size()));
  const uint64_t words[7] = {block.model_fingerprint, block.kv_dtype, block.block_size, block.group,
                             block.chain.lo,          block.chain.hi, block.cache_salt.size()};
  h.update(words, sizeof(words));
  h.update(block.cache_salt);
  EXPECT_EQ(kCodec.name(block), hex(h.final()).substr(0, 32));
}

}  // namespace
}  // namespace pagoda::tier
