#include <gtest/gtest.h>

#include "server/metrics.h"
#include "openai/openai_api.h"

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
  EXPECT_EQ(r.params.stop.list(), (std::vector<std::string>{"a", "b"}));
  // The server copies the params once per prompt: each copy shares the one list.
  const pagoda::sample::RequestParams per_prompt = r.params;
  EXPECT_EQ(per_prompt.stop.get(), r.params.stop.get());
  EXPECT_EQ(r.params.stop.use_count(), 2);
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

TEST(OpenAiApi, CostLimitsNameTheLimit) {
  RequestLimits lim;
  lim.max_stop_bytes = 8;
  lim.max_cache_salt_bytes = 4;
  lim.max_choices = 6;
  lim.max_output_entries = 1000;
  auto bad = [&](const std::string& body) {
    auto r = parse_request(Endpoint::kCompletions, body, lim);
    EXPECT_TRUE(std::holds_alternative<ApiError>(r)) << body;
    return std::holds_alternative<ApiError>(r) ? std::get<ApiError>(r) : ApiError{};
  };
  // A stop string of exactly the limit passes; one byte more names the limit.
  auto r = parse_request(Endpoint::kCompletions, R"({"prompt":"a","stop":"12345678"})", lim);
  ASSERT_TRUE(std::holds_alternative<ParsedRequest>(r));
  EXPECT_EQ(std::get<ParsedRequest>(r).params.stop.list(), (std::vector<std::string>{"12345678"}));
  ApiError e = bad(R"({"prompt":"a","stop":["ok","123456789"]})");
  EXPECT_EQ(e.param, "stop");
  EXPECT_NE(e.message.find("limit is 8"), std::string::npos) << e.message;
  e = bad(R"({"prompt":"a","cache_salt":"12345"})");
  EXPECT_EQ(e.param, "cache_salt");
  EXPECT_NE(e.message.find("limit is 4"), std::string::npos) << e.message;
  // 2 prompts x n 4 = 8 choices > 6.
  e = bad(R"({"prompt":["a","b"],"n":4})");
  EXPECT_EQ(e.param, "n");
  EXPECT_NE(e.message.find("limit is 6"), std::string::npos) << e.message;
  // 2 x 3 x 100 x (1 + 1) = 1200 entries > 1000; with max_tokens 80 it is 960.
  e = bad(R"({"prompt":["a","b"],"n":3,"max_tokens":100,"logprobs":1})");
  EXPECT_NE(e.message.find("1200 output entries"), std::string::npos) << e.message;
  EXPECT_TRUE(std::holds_alternative<ParsedRequest>(
      parse_request(Endpoint::kCompletions, R"({"prompt":["a","b"],"n":3,"max_tokens":80,"logprobs":1})", lim)));
}

TEST(OpenAiApi, JsonDepthIsCheckedBeforeParsing) {
  EXPECT_FALSE(json_too_deep(R"({"a":[[1]]})", 3));
  EXPECT_TRUE(json_too_deep(R"({"a":[[[1]]]})", 3));
  // Brackets inside strings (escaped quotes included) do not count.
  EXPECT_FALSE(json_too_deep(R"({"a":"[[[[\"[[[["})", 1));
  RequestLimits lim;
  std::string deep = "{\"prompt\":" + std::string(100000, '[') + std::string(100000, ']') + "}";
  auto r = parse_request(Endpoint::kCompletions, deep, lim);
  ASSERT_TRUE(std::holds_alternative<ApiError>(r));
  EXPECT_NE(std::get<ApiError>(r).message.find("deeper than 32"), std::string::npos);
}

TEST(OpenAiApi, ResponseFormatting) {
  ResponseMeta m{Endpoint::kChat, "chatcmpl-1", "smol", 42};
  json c = chunk_json(m, json::array({stream_choice_json(Endpoint::kChat, 0, "hi", true, json(),
                                                         pagoda::FinishReason::kNone)}));
  EXPECT_EQ(c["object"], "chat.completion.chunk");
  EXPECT_EQ(c["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(c["choices"][0]["delta"]["content"], "hi");
  EXPECT_TRUE(c["choices"][0]["finish_reason"].is_null());
  json f = response_json(m, json::array({final_choice_json(Endpoint::kChat, 0, "done", json(),
                                                           pagoda::FinishReason::kLength)}),
                         usage_json(5, 3, 2));
  EXPECT_EQ(f["object"], "chat.completion");
  EXPECT_EQ(f["choices"][0]["message"]["content"], "done");
  EXPECT_EQ(f["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(f["usage"]["total_tokens"], 8);
  EXPECT_EQ(f["usage"]["prompt_tokens_details"]["cached_tokens"], 2);
  ResponseMeta mc{Endpoint::kCompletions, "cmpl-1", "s", 1};
  EXPECT_EQ(chunk_json(mc, json::array())["object"], "text_completion");
  EXPECT_EQ(sse(json{{"a", 1}}), "data: {\"a\":1}\n\n");
  EXPECT_EQ(sse_done(), "data: [DONE]\n\n");
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

// Issue 20: fields pagoda does not implement are accepted and listed (the server warns
// once per name); every field the parser reads is not.
TEST(OpenAiApi, IgnoredFieldsAreListed) {
  auto r = ok(Endpoint::kCompletions,
              R"({"prompt":"hi","logit_bias":{"5":1},"best_of":1,"user":"u","max_tokens":3,"temprature":1})");
  EXPECT_EQ(r.ignored_fields, (std::vector<std::string>{"temprature", "user"}));
  auto c = ok(Endpoint::kChat, R"({"messages":[{"role":"user","content":"x"}],"tools":[],"top_logprobs":null,
                                   "logprobs":false,"parallel_tool_calls":true,"echo":true})");
  // echo is a completions field: on chat it is ignored, and said so.
  EXPECT_EQ(c.ignored_fields, (std::vector<std::string>{"echo", "parallel_tool_calls"}));
  EXPECT_TRUE(is_known_field(Endpoint::kChat, "max_completion_tokens"));
  EXPECT_FALSE(is_known_field(Endpoint::kCompletions, "messages"));
}

TEST(OpenAiApi, MaxCompletionTokensOnCompletions) {
  EXPECT_EQ(ok(Endpoint::kCompletions, R"({"prompt":"hi","max_completion_tokens":9})").params.max_tokens, 9);
  EXPECT_EQ(ok(Endpoint::kChat, R"({"messages":[{"role":"user","content":"x"}],"max_completion_tokens":4})")
                .params.max_tokens,
            4);
  EXPECT_EQ(err(Endpoint::kCompletions, R"({"prompt":"hi","max_completion_tokens":0})").param,
            "max_completion_tokens");
}

TEST(OpenAiApi, TokenizeTakesLlamaServerContent) {
  auto t = parse_tokenize(R"({"content":"abc","add_special":false})");
  ASSERT_TRUE(std::holds_alternative<TokenizeRequest>(t));
  EXPECT_EQ(std::get<TokenizeRequest>(t).prompt, "abc");
  EXPECT_FALSE(std::get<TokenizeRequest>(t).add_special_tokens);
  auto bad = parse_tokenize(R"({"content":5})");
  ASSERT_TRUE(std::holds_alternative<ApiError>(bad));
  EXPECT_NE(std::get<ApiError>(bad).message.find("'content'"), std::string::npos);
}

// --metrics-name-prefix and the model_name label: every sample line is renamed and labelled.
TEST(Metrics, PrefixAndModelNameLabel) {
  Metrics m;
  m.set_exposition("vllm", "my \"model\"");
  m.inc_counter("pagoda:request_success_total", 2, "stop");
  m.observe("pagoda:time_to_first_token_seconds", 0.03);
  m.set_gauge("pagoda:kv_group_blocks_used{group=\"1\"}", 5);
  const std::string t = m.render();
  const std::string ml = "model_name=\"my \\\"model\\\"\"";
  EXPECT_NE(t.find("vllm:request_success_total{" + ml + ",finished_reason=\"stop\"} 2\n"), std::string::npos) << t;
  EXPECT_NE(t.find("vllm:time_to_first_token_seconds_bucket{" + ml + ",le=\"0.04\"} 1\n"), std::string::npos);
  EXPECT_NE(t.find("vllm:time_to_first_token_seconds_count{" + ml + "} 1\n"), std::string::npos);
  EXPECT_NE(t.find("vllm:kv_group_blocks_used{" + ml + ",group=\"1\"} 5\n"), std::string::npos);
  EXPECT_NE(t.find("vllm:num_requests_running{" + ml + "} 0\n"), std::string::npos);
  EXPECT_NE(t.find("# TYPE vllm:e2e_request_latency_seconds histogram\n"), std::string::npos);
  EXPECT_EQ(t.find("pagoda:"), std::string::npos);
  // Every non-comment line carries the label.
  size_t lines = 0;
  for (size_t pos = 0; pos < t.size();) {
    const size_t end = t.find('\n', pos);
    const std::string line = t.substr(pos, end - pos);
    if (!line.empty() && line[0] != '#') {
      ++lines;
      EXPECT_NE(line.find("{" + ml), std::string::npos) << line;
    }
    pos = end + 1;
  }
  EXPECT_GT(lines, 100u);
  EXPECT_EQ(m.counter("pagoda:request_success_total", "stop"), 2);  // updates keep the pagoda name
}

// Issue 35 item 7: fields that were accepted and ignored are read or refused.
TEST(OpenAiApi, LogitBiasIsParsedAndChecked) {
  auto r = ok(Endpoint::kCompletions, R"({"prompt":"hi","logit_bias":{"5":1.5,"0":-100,"17":100}})");
  EXPECT_EQ(r.params.logit_bias,
            (std::vector<std::pair<int32_t, float>>{{0, -100.0f}, {5, 1.5f}, {17, 100.0f}}));
  EXPECT_FALSE(check_logit_bias(r.params, 18).has_value());
  auto e = check_logit_bias(r.params, 17);  // id 17 is past a vocabulary of 17
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->status, 400);
  EXPECT_EQ(e->param, "logit_bias");
  EXPECT_NE(e->message.find("17"), std::string::npos);
  EXPECT_TRUE(ok(Endpoint::kChat, R"({"messages":[{"role":"user","content":"x"}],"logit_bias":{"3":2}})")
                  .params.logit_bias.size() == 1);
  for (const char* body : {R"({"prompt":"a","logit_bias":{"-1":1}})", R"({"prompt":"a","logit_bias":{"x":1}})",
                           R"({"prompt":"a","logit_bias":{"1.5":1}})", R"({"prompt":"a","logit_bias":{"":1}})",
                           R"({"prompt":"a","logit_bias":{"4294967296":1}})",
                           R"({"prompt":"a","logit_bias":{"1":100.5}})", R"({"prompt":"a","logit_bias":{"1":"2"}})",
                           R"({"prompt":"a","logit_bias":[1]})", R"({"prompt":"a","logit_bias":{"5":1,"05":2}})"})
    EXPECT_EQ(err(Endpoint::kCompletions, body).param, "logit_bias") << body;
  RequestLimits small;
  small.max_logit_bias = 2;
  auto big = parse_request(Endpoint::kCompletions, R"({"prompt":"a","logit_bias":{"1":1,"2":1,"3":1}})", small);
  ASSERT_TRUE(std::holds_alternative<ApiError>(big));
  EXPECT_EQ(std::get<ApiError>(big).param, "logit_bias");
}

TEST(OpenAiApi, BestOfOnlyEqualToN) {
  EXPECT_EQ(ok(Endpoint::kCompletions, R"({"prompt":"a","best_of":1})").params.n, 1);
  EXPECT_EQ(ok(Endpoint::kCompletions, R"({"prompt":"a","best_of":3,"n":3})").params.n, 3);
  EXPECT_EQ(err(Endpoint::kCompletions, R"({"prompt":"a","best_of":2})").param, "best_of");
  EXPECT_EQ(err(Endpoint::kCompletions, R"({"prompt":"a","best_of":2,"n":3})").param, "best_of");
  EXPECT_EQ(err(Endpoint::kCompletions, R"({"prompt":"a","best_of":"2"})").param, "best_of");
}

TEST(OpenAiApi, GuidedGrammarIsAConstraint) {
  auto r = ok(Endpoint::kCompletions, R"({"prompt":"a","guided_grammar":"root ::= \"yes\""})");
  EXPECT_EQ(r.constraint.spec.kind, pagoda::grammar::ConstraintKind::kGbnf);
  EXPECT_EQ(r.constraint.spec.text, "root ::= \"yes\"");
  EXPECT_TRUE(r.ignored_fields.empty());
  EXPECT_EQ(ok(Endpoint::kChat, R"({"messages":[{"role":"user","content":"x"}],"guided_grammar":"root ::= \"a\""})")
                .constraint.spec.kind,
            pagoda::grammar::ConstraintKind::kGbnf);
  EXPECT_EQ(err(Endpoint::kCompletions, R"({"prompt":"a","guided_grammar":5})").param, "guided_grammar");
  // One constraint at a time.
  EXPECT_EQ(err(Endpoint::kCompletions, R"({"prompt":"a","guided_regex":"a","guided_grammar":"root ::= \"a\""})").status,
            400);
  // null is absent, as for the other guided_* fields.
  EXPECT_TRUE(ok(Endpoint::kCompletions, R"({"prompt":"a","guided_grammar":null})").constraint.spec.empty());
}
