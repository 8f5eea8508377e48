// The options that let `pagoda run` and `pagoda bench` drive the engine:
// recompute (no KV cache), teacher forcing, per-step logits, the one-context
// pool, and the blocks a sequence holds.
#include <gtest/gtest.h>

#include "engine_test_util.h"
#include "kv/sizing.h"
#include "sample/sampler.h"

using namespace pagoda;
using namespace pagoda::enginetest;

namespace {

EngineConfig one_context(int context, int block_size = 16) {
  EngineConfig c = make_config(stories_path(), context, block_size);
  c.num_kv_blocks = 0;
  c.context_length = context;
  c.kv_pool_one_context = true;
  c.watermark = 0;
  c.kv_dtype = KvDtype::F32;
  return c;
}

// Events of one request run alone, in order.
std::vector<TokenEvent> events_alone(Engine* e, const RequestParams& p) {
  std::vector<TokenEvent> out;
  auto id = e->add_request(p);
  EXPECT_TRUE(id.ok()) << id.message();
  if (!id.ok()) return out;
  while (e->has_unfinished()) {
    for (TokenEvent& ev : e->step())
      if (ev.id == *id) out.push_back(std::move(ev));
  }
  return out;
}

std::vector<int32_t> tokens_of(const std::vector<TokenEvent>& evs) {
  std::vector<int32_t> t;
  for (const TokenEvent& ev : evs) t.insert(t.end(), ev.tokens.begin(), ev.tokens.end());
  return t;
}

}  // namespace

// Recompute: every step computes the sequences again from position 0. Two
// requests in the same steps (one of them chunked) still give the reference.
TEST(EngineRecompute, BatchGivesTheCachedTokens) {
  const auto refs = load_references();
  EngineConfig c = make_config(stories_path(), 1024);
  c.recompute = true;
  c.max_num_batched_tokens = 8;  // the 12-token prompt is prefilled in two chunks
  auto e = make_engine(c);
  ASSERT_TRUE(e);
  Driver d(e.get());
  const RequestId a = d.add(greedy(refs[0].prompt_tokens, 40));
  const RequestId b = d.add(greedy(refs[1].prompt_tokens, 40));
  d.run();
  EXPECT_EQ(d.result(a).tokens, std::vector<int32_t>(refs[0].generated_tokens.begin(), refs[0].generated_tokens.begin() + 40));
  EXPECT_EQ(d.result(b).tokens, std::vector<int32_t>(refs[1].generated_tokens.begin(), refs[1].generated_tokens.begin() + 40));
  EXPECT_EQ(d.result(a).text, refs[0].text.substr(0, d.result(a).text.size()));
  // Prefix caching is off under recompute (blocks are rewritten every step).
  const RequestId again = d.add(greedy(refs[0].prompt_tokens, 4));
  d.run();
  EXPECT_EQ(d.result(again).first_num_cached, 0);
  EXPECT_EQ(e->stats().prefix_hits_tokens, 0);
  EXPECT_EQ(e->stats().blocks_used, 0);
}

// The work is the baseline's: step k of a lone request computes all its
// tokens so far (prompt 5: 5, then 6, 7, ...), where the cache computes one.
TEST(EngineRecompute, EveryStepComputesTheWholeSequence) {
  const Reference ref = load_references().at(0);
  for (bool recompute : {false, true}) {
    EngineConfig c = one_context(64);
    c.recompute = recompute;
    auto e = make_engine(c);
    ASSERT_TRUE(e);
    const auto evs = events_alone(e.get(), greedy(ref.prompt_tokens, 10));
    EXPECT_EQ(tokens_of(evs), std::vector<int32_t>(ref.generated_tokens.begin(), ref.generated_tokens.begin() + 10));
    // Cached: 5 + 9 x 1. Recomputed: 5 + 6 + ... + 14.
    EXPECT_EQ(e->stats().computed_tokens_total, recompute ? 5 + (6 + 14) * 9 / 2 : 5 + 9) << recompute;
  }
}

TEST(EngineRecompute, RefusesParallelSamples) {
  EngineConfig c = make_config(stories_path(), 1024);
  c.recompute = true;
  auto e = make_engine(c);
  ASSERT_TRUE(e);
  const EngineStats before = e->stats();
  auto r = e->add_request(seeded(load_references().at(0).prompt_tokens, 4, 1, 2));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("n = 2"), std::string::npos) << r.message();
  EXPECT_TRUE(stats_equal(e->stats(), before));
  EXPECT_FALSE(e->has_unfinished());
}

// Teacher forcing: forced tokens are generated whatever the sampler says; the
// event carries the greedy pick; the logits row is the same bits as a free run
// that produced the same tokens, and a different forced token changes later rows.
TEST(EngineForcing, ForcedTokensArgmaxAndLogits) {
  const Reference ref = load_references().at(0);
  auto e = make_engine(one_context(64));
  ASSERT_TRUE(e);
  RequestParams free_run = greedy(ref.prompt_tokens, 6);
  free_run.return_logits = true;
  const auto free_ev = events_alone(e.get(), free_run);
  ASSERT_EQ(free_ev.size(), 6u);
  EXPECT_EQ(tokens_of(free_ev), std::vector<int32_t>(ref.generated_tokens.begin(), ref.generated_tokens.begin() + 6));
  for (const TokenEvent& ev : free_ev) {
    ASSERT_EQ(ev.logits.size(), 512u);
    EXPECT_EQ(sample::argmax(ev.logits), ev.tokens.at(0));
    EXPECT_EQ(ev.argmax, -1);  // nothing forced
  }

  RequestParams same = free_run;
  same.forced_tokens.assign(ref.generated_tokens.begin(), ref.generated_tokens.begin() + 3);
  const auto same_ev = events_alone(e.get(), same);
  ASSERT_EQ(same_ev.size(), 6u);
  EXPECT_EQ(tokens_of(same_ev), tokens_of(free_ev));
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(same_ev[i].argmax, i < 3 ? ref.generated_tokens[i] : -1) << i;
    EXPECT_EQ(same_ev[i].logits, free_ev[i].logits) << "step " << i;
  }

  // Force another first token: the prompt's row is unchanged, the next is not.
  RequestParams other = free_run;
  other.forced_tokens = {ref.generated_tokens[0] == 7 ? 8 : 7};
  const auto other_ev = events_alone(e.get(), other);
  ASSERT_EQ(other_ev.size(), 6u);
  EXPECT_EQ(other_ev[0].tokens.at(0), other.forced_tokens[0]);
  EXPECT_EQ(other_ev[0].argmax, ref.generated_tokens[0]);
  EXPECT_EQ(other_ev[0].logits, free_ev[0].logits);
  EXPECT_NE(other_ev[1].logits, free_ev[1].logits);
  EXPECT_EQ(other_ev[1].argmax, -1);

  // The sampler records forced tokens: under a presence penalty that bans every
  // generated token, forcing the tokens a free run picks gives that free run.
  RequestParams banned = greedy(ref.prompt_tokens, 12);
  banned.presence_penalty = 100.0f;
  const auto banned_free = tokens_of(events_alone(e.get(), banned));
  ASSERT_EQ(banned_free.size(), 12u);
  banned.forced_tokens.assign(banned_free.begin(), banned_free.begin() + 4);
  EXPECT_EQ(tokens_of(events_alone(e.get(), banned)), banned_free);

  // Without return_logits no row is copied.
  const auto plain = events_alone(e.get(), greedy(ref.prompt_tokens, 2));
  for (const TokenEvent& ev : plain) EXPECT_TRUE(ev.logits.empty());
}

TEST(EngineForcing, BadForcedTokensChangeNothing) {
  const Reference ref = load_references().at(0);
  auto e = make_engine(make_config(stories_path(), 1024));
  ASSERT_TRUE(e);
  const EngineStats before = e->stats();
  RequestParams oov = greedy(ref.prompt_tokens, 4);
  oov.forced_tokens = {3, 512};
  auto r = e->add_request(oov);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("outside the vocabulary"), std::string::npos) << r.message();
  RequestParams neg = greedy(ref.prompt_tokens, 4);
  neg.forced_tokens = {-1};
  EXPECT_FALSE(e->add_request(neg).ok());
  RequestParams lp = greedy(ref.prompt_tokens, 4);
  lp.forced_tokens = {3};
  lp.logprobs = 0;
  EXPECT_FALSE(e->add_request(lp).ok());
  EXPECT_TRUE(stats_equal(e->stats(), before)) << stats_string(e->stats());
  EXPECT_FALSE(e->has_unfinished());
}

// kv_pool_one_context: exactly the blocks of one context (+ the null block),
// sized with kv/sizing; a request may fill it (watermark 0).
TEST(EnginePool, OneContextPoolSizedWithKvSizing) {
  const Reference ref = load_references().at(0);
  for (int bs : {7, 16}) {
    SCOPED_TRACE(bs);
    auto e = make_engine(one_context(100, bs));
    ASSERT_TRUE(e);
    const auto& mi = e->model_info();
    const int blocks = (100 + bs - 1) / bs + 1;
    EXPECT_EQ(mi.num_kv_blocks, blocks);
    EXPECT_EQ(mi.context_length, 100);
    EXPECT_EQ(mi.n_ctx_train, 512);
    EXPECT_EQ(mi.kv_dtype, KvDtype::F32);
    kv::KvShape shape;
    shape.num_layers = 5;
    shape.num_kv_heads = 4;
    shape.head_dim = 8;
    EXPECT_EQ(mi.kv_bytes_per_block, static_cast<int64_t>(kv::kv_bytes_per_block(shape, kv::kv_dtype_f32(), bs)));
    EXPECT_EQ(mi.kv_bytes_per_block, bs * 5 * 2 * 32 * 4);
    EXPECT_EQ(mi.kv_cache_bytes, blocks * mi.kv_bytes_per_block);
    // prompt 5 + 95 = the whole context; the events say how many blocks the
    // sequence holds: the tokens computed so far, whole blocks.
    const auto evs = events_alone(e.get(), greedy(ref.prompt_tokens, 95));
    ASSERT_EQ(evs.size(), 95u);
    for (size_t k = 0; k < evs.size(); ++k) {
      const int64_t computed = 5 + static_cast<int64_t>(k);  // the prompt and the tokens fed before this one
      ASSERT_EQ(evs[k].num_kv_blocks, kv::blocks_for_tokens(computed, bs)) << "token " << k;
    }
    EXPECT_EQ(evs.back().finish, FinishReason::kLength);
    EXPECT_FALSE(e->add_request(greedy(ref.prompt_tokens, 96)).ok());  // 101 > 100
  }
}
