#include <gtest/gtest.h>

#include "server/metrics.h"
#include "server/openai_api.h"

using namespace pagoda::server;

namespace {
ParsedRequest ok(Endpoint ep, const std::string& body) {
  auto r = parse_request(ep, body);
  if (auto* e = std::get_if<ApiError>(&r)) ADD_FAILURE() << body << " -> " << e->message;
  return std::get<ParsedRequest>(r);
}
ApiError err(Endpoint ep, const std::string& body) {
  auto r = parse_request(ep, body);
  EXPECT_TRUE(std::holds_alternative<ApiError>(r)) << body;
  return std::holds_alternative<ApiError>(r) ? std::get<ApiError>(r) : ApiError{};
}
}  // namespace

TEST(OpenAiApi, ParsesCompletionFields) {
  auto r = ok(Endpoint::kCompletions,
              R"({"model":"m","prompt":"hi","max_tokens":7,"temperature":0,"top_k":5,"top_p":0.5,"seed":-3,
                  "stop":["a","b"],"n":2,"echo":true,"logprobs":2,"stream":true,"stream_options":{"include_usage":true}})");
  EXPECT_EQ(r.model, "m");
  ASSERT_EQ(r.prompt_texts.size(), 1u);
  EXPECT_EQ(r.params.max_tokens, 7);
  EXPECT_EQ(r.params.temperature, 0.0f);
  EXPECT_EQ(r.params.top_k, 5);
  EXPECT_TRUE(r.params.has_seed);
  EXPECT_EQ(static_cast<int64_t>(r.params.seed), -3);
  EXPECT_EQ(r.params.stop, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(r.params.n, 2);
  EXPECT_EQ(r.params.logprobs, 2);
  EXPECT_TRUE(r.echo && r.stream && r.include_usage);
}

TEST(OpenAiApi, TokenPromptsAndBatches) {
  auto r = ok(Endpoint::kCompletions, R"({"prompt":[1,2,3]})");
  ASSERT_TRUE(r.prompt_is_tokens);
  EXPECT_EQ(r.prompt_tokens[0], (std::vector<int32_t>{1, 2, 3}));
  r = ok(Endpoint::kCompletions, R"({"prompt":[[1],[2,3]]})");
  EXPECT_EQ(r.prompt_tokens.size(), 2u);
  r = ok(Endpoint::kCompletions, R"({"prompt":["a","b"]})");
  EXPECT_EQ(r.prompt_texts.size(), 2u);
  EXPECT_EQ(r.params.max_tokens, 16);  // OpenAI's default for completions
}

TEST(OpenAiApi, ChatMessagesAndLimits) {
  auto r = ok(Endpoint::kChat, R"({"messages":[{"role":"system","content":"s"},
      {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],
      "max_completion_tokens":9,"logprobs":true,"top_logprobs":3})");
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[1].content, "ab");
  EXPECT_EQ(r.params.max_tokens, 9);
  EXPECT_EQ(r.params.logprobs, 3);
  EXPECT_EQ(ok(Endpoint::kChat, R"({"messages":[{"role":"user","content":"x"}]})").params.max_tokens, -1);
}

TEST(OpenAiApi, ReturnTokenIdsAndIgnoreEos) {
  EXPECT_FALSE(ok(Endpoint::kCompletions, R"({"prompt":"a"})").return_token_ids);
  auto r = ok(Endpoint::kCompletions, R"({"prompt":"a","return_token_ids":true,"ignore_eos":true})");
  EXPECT_TRUE(r.return_token_ids);
  EXPECT_TRUE(r.params.ignore_eos);
  EXPECT_TRUE(ok(Endpoint::kChat, R"({"messages":[{"role":"user","content":"x"}],"return_token_ids":true})")
                  .return_token_ids);
  EXPECT_EQ(err(Endpoint::kCompletions, R"({"prompt":"a","return_token_ids":1})").param, "return_token_ids");
}

TEST(OpenAiApi, RejectsWithParamAndMessage) {
  ApiError e = err(Endpoint::kCompletions, R"({"prompt":"a","max_tokens":-2})");
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, "max_tokens");
  EXPECT_NE(e.message.find("-2"), std::string::npos);
  EXPECT_EQ(err(Endpoint::kCompletions, R"({"prompt":"a","temperature":"x"})").param, "temperature");
  EXPECT_EQ(err(Endpoint::kCompletions, "{\"prompt\":\"\xff\"}").status, 400);
  EXPECT_EQ(err(Endpoint::kChat, R"({"messages":[{"role":"robot","content":"x"}]})").param, "messages");
  EXPECT_EQ(err(Endpoint::kCompletions, R"({"prompt":"a","max_tokens":18446744073709551615})").param, "max_tokens");
}

TEST(OpenAiApi, ErrorBodyShape) {
  auto j = nlohmann::json::parse(error_body(ApiError{400, "bad thing", "invalid_request_error", "n", "invalid_value"}));
  EXPECT_EQ(j["error"]["message"], "bad thing");
  EXPECT_EQ(j["error"]["param"], "n");
  EXPECT_TRUE(j["error"].contains("code"));
}

TEST(Metrics, RendersPrometheusText) {
  Metrics m;
  m.inc_counter("pagoda:request_success_total", 2, "stop");
  m.observe("pagoda:time_to_first_token_seconds", 0.03);
  m.set_gauge("pagoda:kv_cache_usage_perc", 0.25);
  std::string t = m.render();
  EXPECT_NE(t.find("pagoda:request_success_total{finished_reason=\"stop\"} 2"), std::string::npos);
  EXPECT_NE(t.find("pagoda:time_to_first_token_seconds_bucket{le=\"0.04\"} 1"), std::string::npos);
  EXPECT_NE(t.find("pagoda:time_to_first_token_seconds_count 1"), std::string::npos);
  EXPECT_NE(t.find("pagoda:kv_cache_usage_perc 0.25"), std::string::npos);
  EXPECT_NE(t.find("# TYPE pagoda:e2e_request_latency_seconds histogram"), std::string::npos);
}
