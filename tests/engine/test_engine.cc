// Engine tests: golden outputs through the engine, batch invariance, prefix
// caching, block size / KV dtype independence, n > 1 sampling, stop strings,
// abort and request validation. See engine_test_util.h for the event checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

#include "engine_test_util.h"

namespace pagoda::enginetest {
namespace {

// ---------------------------------------------------------------- 1. golden

TEST(EngineGolden, StoriesReferenceTokensAndText) {
  const auto refs = load_references();
  ASSERT_EQ(refs.size(), 3u);
  auto e = make_engine(make_config(stories_path(), 4096));
  ASSERT_TRUE(e);
  EXPECT_EQ(e->model_info().context_length, 512);
  EXPECT_EQ(e->model_info().vocab_size, 512);
  for (const Reference& ref : refs) {
    SCOPED_TRACE(ref.prompt);
    EXPECT_EQ(e->tokenizer().encode(ref.prompt, true, false), ref.prompt_tokens);
    // EOS honoured (ignore_eos off): the reference has none in its 200 tokens.
    const ChoiceResult r = run_alone(e.get(), greedy(ref.prompt_tokens, 200, /*ignore_eos=*/false));
    EXPECT_EQ(r.tokens, ref.generated_tokens) << "first difference at " << common_prefix(r.tokens, ref.generated_tokens);
    EXPECT_EQ(r.text, ref.text);
    EXPECT_EQ(r.finish, FinishReason::kLength);
    EXPECT_EQ(r.num_prompt, static_cast<int32_t>(ref.prompt_tokens.size()));
    EXPECT_EQ(r.events, 200);
  }
  const EngineStats s = e->stats();
  EXPECT_EQ(s.blocks_used, 0);
  EXPECT_EQ(s.generation_tokens_total, 600);
  EXPECT_EQ(s.prompt_tokens_total, 5 + 12 + 6);
}

// ------------------------------------------------------- 2. batch invariance

const char* const kTexts[] = {
    "Tom had a red ball.",
    "The sun was hot and the sky was blue. Sue wanted to swim",
    "Once there was a big dog",
    "Mia and Ben found a box in the garden. Inside the box",
    "A little bird sat on a tree",
    "The boy was sad because",
    "One day, a cat and a mouse",
    "Lily liked to draw pictures of flowers, trees and her mom. One morning",
    "It was a cold day",
    "The old man smiled",
    "Max ran to the park with his friend Sam. They saw",
    "Anna had a toy car. It was fast and shiny and",
    "The frog jumped",
    "There was a small house near the river, and in the house lived",
    "Ben wanted a cookie",
    "The girl",
    "Every night the moon",
    "Tim and his dad went fishing at the lake",
    "Sara found a shiny stone. She",
    "The teacher said",
};

// n prompts: the references, then tokenized texts, then BOS + random ids.
std::vector<std::vector<int32_t>> make_prompts(const Engine& e, int n, bool with_refs, uint64_t seed) {
  std::vector<std::vector<int32_t>> out;
  if (with_refs)
    for (const Reference& r : load_references()) out.push_back(r.prompt_tokens);
  for (const char* t : kTexts) {
    if (static_cast<int>(out.size()) >= n - n / 3) break;
    out.push_back(e.tokenizer().encode(t, true, false));
  }
  Rng rng(seed);
  const int32_t bos = e.tokenizer().bos_id();
  const int32_t hi = e.model_info().vocab_size - 1;
  while (static_cast<int>(out.size()) < n) out.push_back(random_prompt(&rng, bos, 3, hi, 2, 40));
  out.resize(static_cast<size_t>(n));
  return out;
}

struct Run {
  std::vector<std::vector<int32_t>> tokens;  // per prompt
  int max_running = 0;
};

Run run_all(const EngineConfig& c, const std::vector<std::vector<int32_t>>& prompts, const std::vector<int>& lens) {
  Run run;
  auto e = make_engine(c);
  if (!e) return run;
  Driver d(e.get());
  std::vector<RequestId> ids;
  for (size_t i = 0; i < prompts.size(); ++i) ids.push_back(d.add(greedy(prompts[i], lens[i])));
  while (e->has_unfinished()) {
    d.step();
    run.max_running = std::max(run.max_running, e->stats().num_running);
  }
  d.expect_all_finished();
  for (size_t i = 0; i < prompts.size(); ++i) {
    const ChoiceResult& r = d.result(ids[i]);
    EXPECT_EQ(r.finish, FinishReason::kLength);
    EXPECT_EQ(static_cast<int>(r.tokens.size()), lens[i]);
    run.tokens.push_back(r.tokens);
  }
  EXPECT_EQ(e->stats().blocks_used, 0);
  return run;
}

void check_batch_invariance(const std::string& path, int n_prompts, int min_len, int max_len, bool with_refs,
                            bool also_chunked) {
  EngineConfig base = make_config(path, 16384);
  std::vector<std::vector<int32_t>> prompts;
  {
    auto e = make_engine(base);
    ASSERT_TRUE(e);
    prompts = make_prompts(*e, n_prompts, with_refs, 7);
  }
  std::vector<int> lens;
  for (int i = 0; i < n_prompts; ++i) lens.push_back(min_len + i % (max_len - min_len + 1));

  // Alone: one request at a time, no prefix cache.
  EngineConfig alone = base;
  alone.max_num_seqs = 1;
  alone.enable_prefix_caching = false;
  const Run ref = run_all(alone, prompts, lens);
  ASSERT_EQ(ref.tokens.size(), prompts.size());
  EXPECT_EQ(ref.max_running, 1);

  // All at once (added before the first step), with the prefix cache.
  const Run all = run_all(base, prompts, lens);
  EXPECT_EQ(all.max_running, n_prompts) << "the batch never held every request";
  ASSERT_EQ(all.tokens.size(), prompts.size());
  for (int i = 0; i < n_prompts; ++i) {
    EXPECT_EQ(all.tokens[i], ref.tokens[i]) << "prompt " << i << ": batched differs from alone at token "
                                            << common_prefix(all.tokens[i], ref.tokens[i]);
  }
  if (also_chunked) {
    // All at once with a small token budget: chunked prefills mixed with decodes.
    EngineConfig chunked = base;
    chunked.max_num_batched_tokens = 24;
    const Run mixed = run_all(chunked, prompts, lens);
    ASSERT_EQ(mixed.tokens.size(), prompts.size());
    for (int i = 0; i < n_prompts; ++i) {
      EXPECT_EQ(mixed.tokens[i], ref.tokens[i]) << "prompt " << i << ": chunked differs from alone at token "
                                                << common_prefix(mixed.tokens[i], ref.tokens[i]);
    }
  }
  if (with_refs) {  // and the alone run is the golden one
    const auto refs = load_references();
    for (size_t i = 0; i < refs.size(); ++i) {
      const std::vector<int32_t> want(refs[i].generated_tokens.begin(),
                                      refs[i].generated_tokens.begin() + lens[i]);
      EXPECT_EQ(ref.tokens[i], want) << "reference " << i;
    }
  }
}

// 32 prompts x 48..64 tokens (quick mode: 16 x 24..32).
TEST(EngineBatch, StoriesBatchOf32EqualsAlone) {
  check_batch_invariance(stories_path(), scaled(32, 16), scaled(48, 24), scaled(64, 32), /*with_refs=*/true,
                         /*also_chunked=*/true);
}

// Synthetic SmolLM2-135M shape (2 layers, q8_0 weights, vocab 49152):
// 32 prompts x 12..16 tokens (quick mode: 6 x 4..6).
TEST(EngineBatch, SynthSmolLM2BatchOf32EqualsAlone) {
  const std::string& path = synth_smollm_path();
  ASSERT_FALSE(path.empty());
  check_batch_invariance(path, scaled(32, 6), scaled(12, 4), scaled(16, 6), /*with_refs=*/false,
                         /*also_chunked=*/false);
}

// ------------------------------------------------------------ 4. prefix cache

// The first reference prompt continued by its reference tokens: `len` tokens.
std::vector<int32_t> long_prompt(size_t len) {
  const Reference ref = load_references().at(0);
  std::vector<int32_t> p = ref.prompt_tokens;
  p.insert(p.end(), ref.generated_tokens.begin(), ref.generated_tokens.end());
  p.resize(len);
  return p;
}

TEST(EnginePrefix, HitGivesSameTokens) {
  for (size_t len : {55u, 64u}) {  // 3 full blocks + 7; exactly 4 blocks (the last token is never cached)
    SCOPED_TRACE("prompt of " + std::to_string(len));
    auto e = stories_engine();
    ASSERT_TRUE(e);
    const ChoiceResult a = run_alone(e.get(), greedy(long_prompt(len), 40));
    const ChoiceResult b = run_alone(e.get(), greedy(long_prompt(len), 40));
    EXPECT_EQ(a.first_num_cached, 0);
    EXPECT_EQ(b.first_num_cached, 48);
    ASSERT_EQ(a.tokens.size(), 40u);
    EXPECT_EQ(b.tokens, a.tokens);
    EXPECT_EQ(b.text, a.text);
    EXPECT_EQ(e->stats().prefix_hits_tokens, 48);
    // And the tokens are the reference's continuation.
    const std::vector<int32_t> ref = long_prompt(len + 40);
    EXPECT_EQ(a.tokens, std::vector<int32_t>(ref.begin() + static_cast<long>(len), ref.end()));
  }
}

TEST(EnginePrefix, DisabledNeverHits) {
  EngineConfig c = make_config(stories_path(), 2048);
  c.enable_prefix_caching = false;
  auto e = make_engine(c);
  ASSERT_TRUE(e);
  const ChoiceResult a = run_alone(e.get(), greedy(long_prompt(55), 40));
  const ChoiceResult b = run_alone(e.get(), greedy(long_prompt(55), 40));
  EXPECT_EQ(a.first_num_cached, 0);
  EXPECT_EQ(b.first_num_cached, 0);
  EXPECT_EQ(b.tokens, a.tokens);
  EXPECT_EQ(e->stats().prefix_hits_tokens, 0);
  EXPECT_EQ(e->stats().blocks_cached, 0);
}

TEST(EnginePrefix, CacheSaltIsolates) {
  auto e = stories_engine();
  ASSERT_TRUE(e);
  RequestParams p = greedy(long_prompt(55), 24);
  p.cache_salt = "tenant-a";
  const ChoiceResult a = run_alone(e.get(), p);
  p.cache_salt = "tenant-b";
  const ChoiceResult b = run_alone(e.get(), p);
  p.cache_salt = "";
  const ChoiceResult c = run_alone(e.get(), p);
  p.cache_salt = "tenant-a";
  const ChoiceResult d = run_alone(e.get(), p);
  // Only the same salt hits; the tokens never depend on it.
  EXPECT_EQ((std::vector<int>{a.first_num_cached, b.first_num_cached, c.first_num_cached, d.first_num_cached}),
            (std::vector<int>{0, 0, 0, 48}));
  for (const ChoiceResult* r : {&b, &c, &d}) EXPECT_EQ(r->tokens, a.tokens);
}

// Two identical prompts added together: the scheduler's in-flight dedup makes
// the second wait one step and then hit what the first computed.
TEST(EnginePrefix, ConcurrentSamePromptHitsAfterDedup) {
  auto e = stories_engine();
  ASSERT_TRUE(e);
  Driver d(e.get());
  const RequestId a = d.add(greedy(long_prompt(55), 32));
  const RequestId b = d.add(greedy(long_prompt(55), 32));
  d.run();
  EXPECT_EQ(d.result(a).first_num_cached, 0);
  EXPECT_EQ(d.result(b).first_num_cached, 48);
  EXPECT_EQ(d.result(b).tokens, d.result(a).tokens);
  EXPECT_EQ(d.result(a).tokens.size(), 32u);
}

// ------------------------------------------ 5. block size and KV dtype

TEST(EngineLayout, BlockSizeIndependence) {
  const Reference ref = load_references().at(0);
  const std::vector<int32_t> want(ref.generated_tokens.begin(), ref.generated_tokens.begin() + 64);
  for (int bs : {1, 7, 16, 256}) {
    SCOPED_TRACE("block size " + std::to_string(bs));
    auto e = make_engine(make_config(stories_path(), 1024, bs));
    ASSERT_TRUE(e);
    EXPECT_EQ(e->model_info().block_size, bs);
    const ChoiceResult r = run_alone(e.get(), greedy(ref.prompt_tokens, 64));
    EXPECT_EQ(r.tokens, want) << "first difference at " << common_prefix(r.tokens, want);
    // Twice: the second run goes through the prefix cache (block size 1 and 7 hit).
    const ChoiceResult r2 = run_alone(e.get(), greedy(ref.prompt_tokens, 64));
    EXPECT_EQ(r2.tokens, want);
    EXPECT_EQ(r2.first_num_cached, (static_cast<int>(ref.prompt_tokens.size()) - 1) / bs * bs);
  }
}

std::vector<int32_t> run_dtype(const std::string& path, KvDtype dt, const std::vector<int32_t>& prompt, int n) {
  EngineConfig c = make_config(path, 1024);
  c.kv_dtype = dt;
  auto e = make_engine(c);
  if (!e) return {};
  return run_alone(e.get(), greedy(prompt, n)).tokens;
}

TEST(EngineLayout, KvDtypesStories) {
  const Reference ref = load_references().at(0);
  const std::vector<int32_t> want(ref.generated_tokens.begin(), ref.generated_tokens.begin() + 64);
  const auto f32 = run_dtype(stories_path(), KvDtype::F32, ref.prompt_tokens, 64);
  const auto f16 = run_dtype(stories_path(), KvDtype::F16, ref.prompt_tokens, 64);
  const auto bf16 = run_dtype(stories_path(), KvDtype::BF16, ref.prompt_tokens, 64);
  const auto q8 = run_dtype(stories_path(), KvDtype::Q8_0, ref.prompt_tokens, 64);  // kv_dim 4 x 8 = 32
  EXPECT_EQ(f32, want) << "first difference at " << common_prefix(f32, want);
  EXPECT_EQ(f16, want) << "first difference at " << common_prefix(f16, want);
  ASSERT_EQ(bf16.size(), 64u);
  ASSERT_EQ(q8.size(), 64u);
  const std::vector<int32_t> f16_32(f16.begin(), f16.begin() + 32);
  std::printf("[ kv dtypes ] stories260K, common prefix with the f16 run in the first 32 tokens: bf16 %d, q8_0 %d\n",
              common_prefix(std::vector<int32_t>(bf16.begin(), bf16.begin() + 32), f16_32),
              common_prefix(std::vector<int32_t>(q8.begin(), q8.begin() + 32), f16_32));
  EXPECT_GE(common_prefix(std::vector<int32_t>(q8.begin(), q8.begin() + 32), f16_32), 28);
}

// For each k < forced.size(): the greedy token `e` picks after prompt + forced[0..k)
// (teacher forcing: one request per position; the prefix cache keeps it cheap).
std::vector<int32_t> teacher_forced(Engine* e, const std::vector<int32_t>& prompt,
                                    const std::vector<int32_t>& forced) {
  std::vector<int32_t> out;
  std::vector<int32_t> ctx = prompt;
  for (int32_t t : forced) {
    const ChoiceResult r = run_alone(e, greedy(ctx, 1));
    out.push_back(r.tokens.empty() ? -1 : r.tokens[0]);
    ctx.push_back(t);
  }
  return out;
}

int count_equal(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  int n = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) n += a[i] == b[i];
  return n;
}

// The criterion on the real SmolLM2-135M: with q8_0 KV the model picks
// the f16-KV greedy token at >= 28 of the first 32 positions. Measured with
// teacher forcing (q8_0 continues the f16 sequence), because free-running
// greedy text on this Q4_1 model has near-ties that make any two slightly
// different numerics part ways early (f32 vs f16 KV too); the free-running
// common prefix is printed for information.
TEST(EngineLayout, KvQ8MatchesF16OnSmolLM2) {
  if (!file_exists(smollm_path())) GTEST_SKIP() << smollm_path() << " is missing";
  if (quick_mode()) GTEST_SKIP() << "slow under sanitizers / PAGODA_TEST_QUICK";
  EngineConfig c16 = make_config(smollm_path(), 1024);
  EngineConfig c8 = c16;
  c8.kv_dtype = KvDtype::Q8_0;
  auto e16 = make_engine(c16);
  auto e8 = make_engine(c8);
  ASSERT_TRUE(e16 && e8);
  const std::vector<int32_t> prompt = e16->tokenizer().encode(
      "<|im_start|>user\nWrite a short story about a robot who learns to paint.<|im_end|>\n<|im_start|>assistant\n",
      false, true);
  const auto f16 = run_alone(e16.get(), greedy(prompt, 32)).tokens;
  const auto q8 = run_alone(e8.get(), greedy(prompt, 32)).tokens;
  ASSERT_EQ(f16.size(), 32u);
  ASSERT_EQ(q8.size(), 32u);
  const auto q8_forced = teacher_forced(e8.get(), prompt, f16);
  const int agree = count_equal(q8_forced, f16);
  std::printf("[ kv dtypes ] SmolLM2-135M, q8_0 vs f16 KV: free-running common prefix %d of 32, "
              "teacher-forced agreement %d of 32\n",
              common_prefix(f16, q8), agree);
  EXPECT_GE(agree, 28);
  EXPECT_EQ(q8_forced[0], q8[0]);  // the first position is the same request in both
}

// ModelInfo reflects the pool; the context is capped by it and enforced.
TEST(EngineLayout, ModelInfoAndPoolCappedContext) {
  EngineConfig c = make_config(stories_path());
  c.num_kv_blocks = 17;  // 16 usable blocks of 16 = 256 tokens < the model's 512
  auto e = make_engine(c);
  ASSERT_TRUE(e);
  const auto& mi = e->model_info();
  EXPECT_EQ(std::tie(mi.name, mi.architecture, mi.vocab_size), std::make_tuple("stories260K", "llama", 512));
  // 17 blocks of 16 (the null block included) hold 256 tokens, which cap the context.
  EXPECT_EQ(std::tie(mi.num_kv_blocks, mi.block_size, mi.kv_cache_tokens, mi.context_length),
            std::make_tuple(17, 16, 256, 256));
  EXPECT_EQ(mi.kv_bytes_per_token, 5 * 2 * 32 * 2);  // layers x (K, V) x kv_dim x f16
  EXPECT_EQ(mi.kv_cache_bytes, 17 * 16 * mi.kv_bytes_per_token);
  EXPECT_EQ(e->stats().blocks_total, 16);
  const Reference ref = load_references().at(0);
  EXPECT_FALSE(e->add_request(greedy(ref.prompt_tokens, 252)).ok());  // 5 + 252 > 256
  const ChoiceResult r = run_alone(e.get(), greedy(ref.prompt_tokens, 251));
  EXPECT_EQ(r.tokens.size(), 251u);
  EXPECT_EQ(std::vector<int32_t>(r.tokens.begin(), r.tokens.begin() + 200), ref.generated_tokens);

  // A byte budget instead of a block count; q8_0 rows are 34 bytes per 32 values.
  EngineConfig m = make_config(stories_path());
  m.num_kv_blocks = 0;
  m.kv_cache_memory = 1 << 20;
  m.kv_dtype = KvDtype::Q8_0;
  auto e2 = make_engine(m);
  ASSERT_TRUE(e2);
  EXPECT_EQ(e2->model_info().kv_bytes_per_token, 5 * 2 * 34);
  EXPECT_EQ(e2->model_info().num_kv_blocks, (1 << 20) / (5 * 2 * 34 * 16));
  EXPECT_LE(e2->model_info().kv_cache_bytes, 1 << 20);
  EXPECT_EQ(e2->model_info().context_length, 512);
}

TEST(EngineLayout, RejectsBadLayouts) {
  EngineConfig c = make_config(stories_path(), 1024);
  c.block_size = 0;
  EXPECT_FALSE(Engine::create(c).ok());
  c.block_size = 257;
  EXPECT_FALSE(Engine::create(c).ok());
  c.block_size = 16;
  c.threads = 0;
  EXPECT_FALSE(Engine::create(c).ok());
  c = make_config(stories_path());
  c.num_kv_blocks = 1;  // only the null block
  EXPECT_FALSE(Engine::create(c).ok());
  c = make_config("/nonexistent/model.gguf");
  EXPECT_FALSE(Engine::create(c).ok());
}

}  // namespace
}  // namespace pagoda::enginetest
