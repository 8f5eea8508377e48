// KV cache types below 8 bits, K and V chosen separately (issue 39): through the
// engine, every type alone and in mixed K/V pairs, a request's tokens and every
// logits row are bitwise the same alone, batched, in chunked prefill, after a
// preemption and on a prefix hit (the kernels are batch invariant for every type).
// stories260K: kv_dim 32 = 4 heads of 8 (head slices cut the 32-value blocks);
// the synth SmolLM2 (3 KV heads of 64: whole blocks) runs the same checks.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "base/kv_dtype.h"
#include "base/rng.h"
#include "engine/engine_test_util.h"

namespace pagoda::enginetest {
namespace {

constexpr int32_t kBos = 1, kVocab = 512;  // stories260K

// What one request produced: its tokens and the logits row of each.
struct Output {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
  int32_t num_cached = -1;  // prompt tokens served from the prefix cache (first event)
};

// Runs `reqs` on `e` all at once (added together) and returns each one's output.
std::vector<Output> run_all(Engine* e, const std::vector<RequestParams>& reqs) {
  std::map<RequestId, size_t> index;
  for (size_t i = 0; i < reqs.size(); ++i) {
    auto id = e->add_request(reqs[i]);
    if (!id.ok()) {
      ADD_FAILURE() << "add_request: " << id.message();
      return {};
    }
    index[*id] = i;
  }
  std::vector<Output> out(reqs.size());
  for (int steps = 0; e->has_unfinished(); ++steps) {
    if (steps > 100000) {
      ADD_FAILURE() << "the engine does not finish";
      break;
    }
    for (TokenEvent& ev : e->step()) {
      Output& o = out[index.at(ev.id)];
      EXPECT_TRUE(ev.error.empty()) << ev.error;
      if (o.num_cached < 0) o.num_cached = ev.num_cached_tokens;
      for (int32_t t : ev.tokens) o.tokens.push_back(t);
      if (!ev.tokens.empty()) o.logits.push_back(std::move(ev.logits));
    }
  }
  return out;
}

void expect_same(const Output& got, const Output& want, const std::string& what) {
  ASSERT_EQ(got.tokens, want.tokens) << what << ": first difference at " << common_prefix(got.tokens, want.tokens);
  ASSERT_EQ(got.logits.size(), want.logits.size()) << what;
  for (size_t i = 0; i < want.logits.size(); ++i) {
    ASSERT_EQ(got.logits[i].size(), want.logits[i].size()) << what;
    ASSERT_EQ(std::memcmp(got.logits[i].data(), want.logits[i].data(), want.logits[i].size() * sizeof(float)), 0)
        << what << ": logits row " << i << " differs";
  }
}

std::string name(KvTypes t) { return "K " + std::string(kv_dtype_name(t.k)) + ", V " + kv_dtype_name(t.v); }

// Every type with itself, and mixed pairs (llama.cpp's common -ctk q8_0 -ctv q4_0 and others).
std::vector<KvTypes> pairs() {
  std::vector<KvTypes> p;
  for (KvDtype d : kAllKvDtypes) p.emplace_back(d);
  p.emplace_back(KvDtype::Q8_0, KvDtype::Q4_0);
  p.emplace_back(KvDtype::Q4_0, KvDtype::Q8_0);
  p.emplace_back(KvDtype::F16, KvDtype::IQ4_NL);
  p.emplace_back(KvDtype::Q5_1, KvDtype::Q4_1);
  return p;
}

// The five ways to run the same greedy requests; all must agree bitwise.
void check_invariance(const std::string& path, KvTypes types, int32_t bos, int32_t vocab, int n_req, int max_tokens) {
  SCOPED_TRACE(name(types) + ", " + path);
  Rng rng(39);
  std::vector<RequestParams> reqs;
  const int lens[] = {29, 45, 61, 22};  // 13 past a block boundary (the decodes cross it), and 6
  for (int i = 0; i < n_req; ++i) {
    const int n = lens[i % 4];
    RequestParams p = greedy(random_prompt(&rng, bos, 3, vocab - 1, n, n), max_tokens);
    p.return_logits = true;
    reqs.push_back(p);
  }
  auto config = [&](int64_t pool_tokens) {
    EngineConfig c = make_config(path, pool_tokens);
    c.kv_dtype = types;
    return c;
  };
  // Alone: one request at a time, no prefix cache.
  std::vector<Output> alone;
  {
    EngineConfig c = config(2048);
    c.max_num_seqs = 1;
    c.enable_prefix_caching = false;
    auto e = make_engine(c);
    ASSERT_TRUE(e);
    EXPECT_EQ(e->model_info().kv_dtype, types);
    for (const RequestParams& p : reqs) alone.push_back(run_all(e.get(), {p}).at(0));
  }
  for (const Output& o : alone) ASSERT_EQ(o.tokens.size(), static_cast<size_t>(max_tokens));
  {  // batched
    auto e = make_engine(config(2048));
    ASSERT_TRUE(e);
    const auto got = run_all(e.get(), reqs);
    for (int i = 0; i < n_req; ++i) expect_same(got[i], alone[i], "batched, request " + std::to_string(i));
  }
  {  // chunked prefill: 7 tokens a step
    EngineConfig c = config(2048);
    c.max_num_batched_tokens = 7;
    auto e = make_engine(c);
    ASSERT_TRUE(e);
    const auto got = run_all(e.get(), reqs);
    for (int i = 0; i < n_req; ++i) expect_same(got[i], alone[i], "chunked, request " + std::to_string(i));
  }
  {  // a pool that holds every prompt but not its growth: decodes preempt the latest admitted
    EngineConfig c = config(0);
    int blocks = 1;  // the null block
    for (const RequestParams& p : reqs) blocks += static_cast<int>((p.prompt.size() + 15) / 16);
    c.num_kv_blocks = blocks;
    c.watermark = 0;
    auto e = make_engine(c);
    ASSERT_TRUE(e);
    const auto got = run_all(e.get(), reqs);
    EXPECT_GT(e->stats().num_preemptions, 0);
    for (int i = 0; i < n_req; ++i) expect_same(got[i], alone[i], "preempted, request " + std::to_string(i));
  }
  {  // prefix hit: the same prompt again is served from the cache
    auto e = make_engine(config(2048));
    ASSERT_TRUE(e);
    const Output cold = run_all(e.get(), {reqs[0]}).at(0);
    const Output hit = run_all(e.get(), {reqs[0]}).at(0);
    EXPECT_EQ(cold.num_cached, 0);
    EXPECT_EQ(hit.num_cached, static_cast<int32_t>((reqs[0].prompt.size() - 1) / 16 * 16));
    EXPECT_GT(hit.num_cached, 0);
    expect_same(cold, alone[0], "cold");
    expect_same(hit, alone[0], "prefix hit");
  }
}

TEST(KvTypes, StoriesEveryPairBitwiseAloneBatchedChunkedPreemptedAndHit) {
  for (KvTypes t : pairs()) check_invariance(stories_path(), t, kBos, kVocab, 4, scaled(12, 8));
}

TEST(KvTypes, SynthSmolLM2WholeBlockSlicesBitwise) {
  // The 4/5-bit types and the common mixed pair (stories260K covers every pair).
  std::vector<KvTypes> sample = {KvTypes(KvDtype::Q8_0, KvDtype::Q4_0)};
  if (!quick_mode()) {
    for (KvDtype d : {KvDtype::Q4_0, KvDtype::Q4_1, KvDtype::IQ4_NL, KvDtype::Q5_0, KvDtype::Q5_1}) sample.emplace_back(d);
  }
  for (KvTypes t : sample) check_invariance(synth_smollm_path(), t, 1, 49152, 2, 6);
}

// Different types give different outputs (the cache really stores each type),
// and a q4_0/q4_0 pool holds 16/9 of the q8_0 tokens: sizing is K bytes + V bytes.
TEST(KvTypes, TypesChangeOutputsAndSizing) {
  Rng rng(5);
  RequestParams p = greedy(random_prompt(&rng, kBos, 3, kVocab - 1, 40, 40), 8);
  p.return_logits = true;
  std::map<std::string, Output> out;
  std::map<std::string, int64_t> per_token, blocks;
  for (KvTypes t : pairs()) {
    EngineConfig c = make_config(stories_path(), 0);
    c.num_kv_blocks = 0;
    c.kv_cache_memory = 1 << 20;
    c.kv_dtype = t;
    auto e = make_engine(c);
    ASSERT_TRUE(e);
    out[name(t)] = run_all(e.get(), {p}).at(0);
    per_token[name(t)] = e->model_info().kv_bytes_per_token;
    blocks[name(t)] = e->model_info().num_kv_blocks;
    // layers x (K row + V row) of kv_dim 32: one block of 32 each.
    EXPECT_EQ(e->model_info().kv_bytes_per_token,
              5 * static_cast<int64_t>(kv_row_bytes(t.k, 32) + kv_row_bytes(t.v, 32)))
        << name(t);
  }
  EXPECT_EQ(per_token.at(name(KvDtype::Q4_0)), 5 * 2 * 18);
  EXPECT_EQ(per_token.at(name(KvTypes(KvDtype::Q8_0, KvDtype::Q4_0))), 5 * (34 + 18));
  EXPECT_GE(blocks.at(name(KvDtype::Q4_0)) * 4, blocks.at(name(KvDtype::Q8_0)) * 7);  // >= 1.75x
  const auto& ref = out.at(name(KvDtype::F32)).logits.at(0);
  for (KvDtype d : {KvDtype::Q4_0, KvDtype::Q4_1, KvDtype::IQ4_NL, KvDtype::Q5_0, KvDtype::Q5_1}) {
    const auto& row = out.at(name(d)).logits.at(0);
    EXPECT_NE(std::memcmp(row.data(), ref.data(), ref.size() * sizeof(float)), 0) << kv_dtype_name(d);
  }
  const auto& a = out.at(name(KvTypes(KvDtype::Q8_0, KvDtype::Q4_0))).logits.at(0);
  const auto& b = out.at(name(KvTypes(KvDtype::Q4_0, KvDtype::Q8_0))).logits.at(0);
  EXPECT_NE(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "K and V types are not swapped";
}

}  // namespace
}  // namespace pagoda::enginetest
