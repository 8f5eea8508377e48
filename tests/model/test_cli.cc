// The built `pagoda run` binary against the stories260K reference.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/run_pagoda.h"
#include "model/golden_util.h"

using namespace pagoda::golden;

namespace {

using Result = pagoda::testutil::CliResult;
using pagoda::testutil::read_floats;
using pagoda::testutil::run_pagoda;

// "1,2,3": the form --prompt-ids and --force-tokens take.
std::string join_ids(const std::vector<int32_t>& ids) {
  std::string out;
  for (int32_t t : ids) {
    if (!out.empty()) out += ',';
    out += std::to_string(t);
  }
  return out;
}

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// `pagoda run` of stories260K on the prompt text; the caller appends the options.
std::string run_stories(const std::string& prompt) {
  return "run -m " + quote(stories_path()) + " -p " + quote(prompt);
}

}  // namespace

TEST(PagodaRun, JsonGreedyMatchesReference) {
  for (const Reference& ref : load_references()) {
    for (const char* extra : {"", " --no-kv-cache --block-size 7"}) {
      const Result r = run_pagoda(run_stories(ref.prompt) + " -n 200 --temp 0 --kv-dtype f32 -t 1 --json" + extra);
      ASSERT_EQ(r.exit_code, 0) << r.out;
      const auto j = nlohmann::json::parse(r.out);
      EXPECT_EQ(j.at("prompt_tokens").get<std::vector<int32_t>>(), ref.prompt_tokens) << ref.prompt;
      EXPECT_EQ(j.at("generated_tokens").get<std::vector<int32_t>>(), ref.generated_tokens) << ref.prompt << extra;
      EXPECT_EQ(j.at("text").get<std::string>(), ref.text) << ref.prompt << extra;
      EXPECT_EQ(j.at("finish_reason").get<std::string>(), "length");
      // 204 tokens held in f32 KV: 5 layers x 2 x 4 heads x 8 dims x 4 bytes per token, whole blocks.
      const int64_t held = j.at("kv_bytes").get<int64_t>();
      const int64_t per_token = 5 * 2 * 32 * 4;
      EXPECT_GE(held, 204 * per_token);
      EXPECT_EQ(held % per_token, 0);
    }
    if (::testing::Test::HasFailure()) break;
  }
}

// --prompt-ids feeds ids directly (same tokens as -p with those ids);
// --logits-out writes the first step's logits, whose argmax is the greedy token.
TEST(PagodaRun, PromptIdsAndLogitsOut) {
  const Reference ref = load_references().at(0);
  const std::string ids = join_ids(ref.prompt_tokens);
  const std::string logits_path = ::testing::TempDir() + "/pagoda_cli_logits.f32";
  const Result r = run_pagoda("run -m " + quote(stories_path()) + " --prompt-ids " + ids +
                              " -n 24 --temp 0 --kv-dtype f32 -t 1 --json --logits-out " + quote(logits_path));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  const auto gen = j.at("generated_tokens").get<std::vector<int32_t>>();
  ASSERT_EQ(gen.size(), 24u);
  EXPECT_EQ(gen, std::vector<int32_t>(ref.generated_tokens.begin(), ref.generated_tokens.begin() + 24));
  FILE* f = std::fopen(logits_path.c_str(), "rb");
  ASSERT_NE(f, nullptr);
  std::vector<float> logits(512 + 1);
  const size_t n = std::fread(logits.data(), sizeof(float), logits.size(), f);
  std::fclose(f);
  ASSERT_EQ(n, 512u);  // stories260K vocab, nothing more
  size_t best = 0;
  for (size_t i = 1; i < n; ++i) best = logits[i] > logits[best] ? i : best;
  EXPECT_EQ(static_cast<int32_t>(best), gen[0]);
  const Result bad = run_pagoda("run -m " + quote(stories_path()) + " --prompt-ids 1,x,3", true);
  EXPECT_NE(bad.exit_code, 0);
}

// Teacher forcing: forcing the tokens greedy decoding produced reproduces its logits
// at every step, bit for bit; forcing another first token changes only later steps.
TEST(PagodaRun, ForceTokensAndLogitsOutAll) {
  const Reference ref = load_references().at(0);
  const std::string ids = join_ids(ref.prompt_tokens);
  const std::string base = "run -m " + quote(stories_path()) + " --prompt-ids " + ids +
                           " -n 12 --temp 0 --kv-dtype f32 -t 1 --json --logits-out-all ";
  const std::string free_path = ::testing::TempDir() + "/pagoda_cli_all_free.f32";
  const Result r = run_pagoda(base + quote(free_path));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto gen = nlohmann::json::parse(r.out).at("generated_tokens").get<std::vector<int32_t>>();
  ASSERT_EQ(gen.size(), 12u);
  const std::vector<float> free_logits = read_floats(free_path);
  ASSERT_EQ(free_logits.size(), 12u * 512);  // every sampled step, stories260K vocab

  const std::string forced = join_ids(gen);
  const std::string same_path = ::testing::TempDir() + "/pagoda_cli_all_same.f32";
  const Result s = run_pagoda(base + quote(same_path) + " --force-tokens " + forced);
  ASSERT_EQ(s.exit_code, 0) << s.out;
  const auto js = nlohmann::json::parse(s.out);
  EXPECT_EQ(js.at("generated_tokens").get<std::vector<int32_t>>(), gen);
  EXPECT_EQ(js.at("argmax_tokens").get<std::vector<int32_t>>(), gen);
  const std::vector<float> same_logits = read_floats(same_path);
  ASSERT_EQ(same_logits.size(), free_logits.size());
  EXPECT_EQ(std::memcmp(same_logits.data(), free_logits.data(), free_logits.size() * sizeof(float)), 0);

  // Force a different first token (and only that one): step 0's logits are the same,
  // the forced token is generated, its argmax is still greedy's, later steps differ.
  const int32_t other = gen[0] == 7 ? 8 : 7;
  const std::string diff_path = ::testing::TempDir() + "/pagoda_cli_all_diff.f32";
  const Result d = run_pagoda(base + quote(diff_path) + " --force-tokens " + std::to_string(other));
  ASSERT_EQ(d.exit_code, 0) << d.out;
  const auto jd = nlohmann::json::parse(d.out);
  const auto dgen = jd.at("generated_tokens").get<std::vector<int32_t>>();
  ASSERT_EQ(dgen.size(), 12u);
  EXPECT_EQ(dgen[0], other);
  EXPECT_EQ(jd.at("argmax_tokens").get<std::vector<int32_t>>(), std::vector<int32_t>{gen[0]});
  const std::vector<float> diff_logits = read_floats(diff_path);
  ASSERT_EQ(diff_logits.size(), free_logits.size());
  EXPECT_EQ(std::memcmp(diff_logits.data(), free_logits.data(), 512 * sizeof(float)), 0);
  EXPECT_NE(std::memcmp(diff_logits.data() + 512, free_logits.data() + 512, 512 * sizeof(float)), 0);

  // A forced id outside the vocabulary is a clear error.
  const Result bad = run_pagoda(base + quote(diff_path) + " --force-tokens 999999", true);
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.out.find("outside the vocabulary"), std::string::npos) << bad.out;
}

TEST(PagodaRun, StreamsTextAndReportsStats) {
  const Reference ref = load_references().at(0);
  const Result r = run_pagoda(run_stories(ref.prompt) + " -n 200 --temp 0 --kv-dtype f32 -t 1");
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out, ref.text + "\n");
  const Result e = run_pagoda(run_stories(ref.prompt) + " -n 3 -t 1", true);
  ASSERT_EQ(e.exit_code, 0);
  EXPECT_NE(e.out.find("prompt tokens: 5"), std::string::npos) << e.out;
  EXPECT_NE(e.out.find("tok/s"), std::string::npos) << e.out;
  EXPECT_NE(e.out.find("kv cache:"), std::string::npos) << e.out;
}

TEST(PagodaRun, StopStringEndsGenerationBeforeIt) {
  const Reference ref = load_references().at(0);
  const Result r = run_pagoda(run_stories(ref.prompt) + " -n 200 --temp 0 -t 1 --kv-dtype f32 --stop Lily --json");
  ASSERT_EQ(r.exit_code, 0);
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("text").get<std::string>(), ref.text.substr(0, ref.text.find("Lily")));
  EXPECT_EQ(j.at("finish_reason").get<std::string>(), "stop");
}

TEST(PagodaRun, PromptLongerThanContextIsAnError) {
  const Result r = run_pagoda(run_stories("Once upon a time there was") + " -c 4 -t 1", true);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("longer than the context of 4 tokens"), std::string::npos) << r.out;
  const Result m = run_pagoda("run -m /nonexistent.gguf -p hi", true);
  EXPECT_EQ(m.exit_code, 1);
  const Result u = run_pagoda("run --bogus", true);
  EXPECT_EQ(u.exit_code, 2);
}

TEST(PagodaBench, JsonReportsMediansAndStableHash) {
  const Result r = run_pagoda("bench -m " + quote(stories_path()) + " --pp 32 --tg 16 -r 2 -t 1 --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_GT(j.at("pp_tokens_per_s").get<double>(), 0.0);
  EXPECT_GT(j.at("tg_tokens_per_s").get<double>(), 0.0);
  EXPECT_TRUE(j.at("tg_tokens_consistent").get<bool>());
  EXPECT_EQ(j.at("pp_tokens").get<int>(), 32);
  const Result again = run_pagoda("bench -m " + quote(stories_path()) + " --pp 0 --tg 16 -r 1 -t 1 --json");
  ASSERT_EQ(again.exit_code, 0);
  EXPECT_EQ(nlohmann::json::parse(again.out).at("tg_tokens_hash"), j.at("tg_tokens_hash"));
}

// The KV dtype under the names vLLM and llama.cpp users type: --kv-cache-dtype
// (with vLLM's "auto", K and V), and llama.cpp's -ctk / -ctv, K's and V's type
// each (the one not given is f16, as in llama.cpp); a bad name is an error
// naming the flag.
TEST(PagodaRun, KvDtypeUnderVllmAndLlamaCppNames) {
  const std::string base = run_stories("Once upon a time") +
                           " -n 4 --temp 0 -t 1 --json ";
  const auto kv_of = [&](const std::string& flags) {
    const Result r = run_pagoda(base + flags);
    EXPECT_EQ(r.exit_code, 0) << flags << ": " << r.out;
    return r.exit_code == 0 ? nlohmann::json::parse(r.out)["kv_dtype"].get<std::string>() : std::string();
  };
  EXPECT_EQ(kv_of("--kv-cache-dtype q8_0"), "q8_0");
  EXPECT_EQ(kv_of("--kv-cache-dtype auto"), "f16");
  EXPECT_EQ(kv_of("--kv-cache-dtype q4_0"), "q4_0");
  EXPECT_EQ(kv_of("-ctk bf16 -ctv bf16"), "bf16");
  EXPECT_EQ(kv_of("--cache-type-k f32 --cache-type-v f32"), "f32");
  EXPECT_EQ(kv_of("-ctk q4_0 -ctv q8_0"), "q4_0/q8_0");
  EXPECT_EQ(kv_of("-ctk q8_0"), "q8_0/f16");  // V stays f16, as in llama.cpp
  EXPECT_EQ(kv_of("--cache-type-v iq4_nl"), "f16/iq4_nl");
  for (const char* t : {"q4_1", "iq4_nl", "q5_0", "q5_1"}) EXPECT_EQ(kv_of(std::string("-ctk ") + t + " -ctv " + t), t);
  const Result bad = run_pagoda(base + "--kv-cache-dtype fp8", true);
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.out.find("--kv-cache-dtype"), std::string::npos) << bad.out;
  const Result bad_k = run_pagoda(base + "-ctk q3_0 -ctv q8_0", true);
  EXPECT_EQ(bad_k.exit_code, 2);
  EXPECT_NE(bad_k.out.find("'q3_0' for -ctk"), std::string::npos) << bad_k.out;
  const Result bad_v = run_pagoda("bench -m " + quote(stories_path()) + " --pp 8 --tg 2 -r 1 -t 1 -ctv q4", true);
  EXPECT_EQ(bad_v.exit_code, 2);
  EXPECT_NE(bad_v.out.find("'q4' for -ctv"), std::string::npos) << bad_v.out;
}
