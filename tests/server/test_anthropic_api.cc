// Issue 36: parsing of Anthropic's Messages API and of the new OpenAI cache and
// priority fields. Every field lands where the engine reads it; every bad value is a
// 400 naming the field (parsing is pure: a refused body changes nothing).
#include <gtest/gtest.h>

#include <algorithm>

#include "gguf/gguf.h"
#include "openai/anthropic_api.h"
#include "openai/cache_fields.h"
#include "openai/openai_api.h"
#include "openai/text.h"
#include "tok/tokenizer.h"

using namespace pagoda::server;

namespace {
MessagesRequest ok(const std::string& body, bool count_only = false) {
  auto r = parse_messages_request(body, {}, count_only);
  if (auto* e = std::get_if<ApiError>(&r)) {
    ADD_FAILURE() << body << " -> " << e->message;
    return {};
  }
  return std::get<MessagesRequest>(r);
}
ApiError err(const std::string& body) {
  auto r = parse_messages_request(body, {});
  EXPECT_TRUE(std::holds_alternative<ApiError>(r)) << body;
  return std::holds_alternative<ApiError>(r) ? std::get<ApiError>(r) : ApiError{};
}
const char* kUser = R"("messages":[{"role":"user","content":"hi"}])";
std::string with(const std::string& fields) { return std::string("{") + kUser + ",\"max_tokens\":8" + fields + "}"; }
}  // namespace

TEST(AnthropicApi, ParsesEveryField) {
  auto m = ok(R"({"model":"smol","max_tokens":64,"temperature":0.5,"top_p":0.9,"top_k":7,"stream":true,
      "stop_sequences":["END","##"],"metadata":{"user_id":"u-1"},"priority":-4,
      "system":[{"type":"text","text":"Be "},{"type":"text","text":"brief."}],
      "tools":[{"name":"get_weather","description":"Weather","input_schema":{"type":"object",
                "properties":{"city":{"type":"string"},"days":{"type":"integer"}},"required":["city"]}}],
      "tool_choice":{"type":"auto"},
      "messages":[{"role":"user","content":[{"type":"text","text":"Weather in "},{"type":"text","text":"Paris?"}]},
                  {"role":"assistant","content":[{"type":"text","text":"Checking."},
                     {"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Paris","days":2}}]},
                  {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"sunny"},
                     {"type":"text","text":"Thanks"}]}]})");
  const ParsedRequest& r = m.base;
  EXPECT_EQ(r.endpoint, Endpoint::kChat);
  EXPECT_EQ(r.model, "smol");
  EXPECT_EQ(r.params.max_tokens, 64);
  EXPECT_FLOAT_EQ(r.params.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.params.top_p, 0.9f);
  EXPECT_EQ(r.params.top_k, 7);
  EXPECT_TRUE(r.stream);
  EXPECT_EQ(r.params.stop.list(), (std::vector<std::string>{"END", "##"}));
  EXPECT_EQ(m.user_id, "u-1");
  EXPECT_EQ(r.params.priority, -4);
  EXPECT_EQ(r.params.pin_tokens, 0);
  EXPECT_FALSE(m.cache.present);
  ASSERT_EQ(r.messages.size(), 5u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[0].content, "Be brief.");
  EXPECT_EQ(r.messages[1].role, "user");
  EXPECT_EQ(r.messages[1].content, "Weather in Paris?");
  EXPECT_EQ(r.messages[2].role, "assistant");
  EXPECT_EQ(r.messages[2].content, "Checking.");
  ASSERT_TRUE(r.messages[2].tool_calls.is_array());
  ASSERT_EQ(r.messages[2].tool_calls.size(), 1u);
  EXPECT_EQ(r.messages[2].tool_calls[0]["id"], "toolu_1");
  EXPECT_EQ(r.messages[2].tool_calls[0]["function"]["name"], "get_weather");
  // The arguments reach the template as the object, in the order sent.
  EXPECT_EQ(r.messages[2].tool_calls[0]["function"]["arguments"].dump(), R"({"city":"Paris","days":2})");
  EXPECT_EQ(r.messages[3].role, "tool");
  EXPECT_EQ(r.messages[3].content, "sunny");
  EXPECT_EQ(r.messages[3].tool_call_id, "toolu_1");
  EXPECT_EQ(r.messages[3].name, "get_weather");
  EXPECT_EQ(r.messages[4].role, "user");
  EXPECT_EQ(r.messages[4].content, "Thanks");
  const ToolSetup& t = r.constraint.tools;
  EXPECT_EQ(t.choice, ToolChoice::kAuto);
  EXPECT_EQ(t.names, (std::vector<std::string>{"get_weather"}));
  // input_schema becomes the function's parameters, key order kept.
  EXPECT_EQ(t.parameters[0].dump(),
            R"({"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}},"required":["city"]})");
  EXPECT_EQ(t.tools[0]["function"]["description"], "Weather");
  EXPECT_TRUE(r.ignored_fields.empty());
}

TEST(AnthropicApi, Defaults) {
  auto m = ok(with(""));
  EXPECT_EQ(m.base.params.max_tokens, 8);
  EXPECT_FLOAT_EQ(m.base.params.temperature, 1.0f);
  EXPECT_FALSE(m.base.stream);
  EXPECT_TRUE(m.base.params.stop.empty());
  EXPECT_EQ(m.base.params.priority, 0);
  ASSERT_EQ(m.base.messages.size(), 1u);
  EXPECT_EQ(m.base.messages[0].role, "user");
  EXPECT_EQ(m.base.messages[0].content, "hi");
  // Fields pagoda does not implement are named, not refused.
  m = ok(with(R"(,"thinking":{"type":"enabled","budget_tokens":1024},"service_tier":"auto")"));
  EXPECT_EQ(m.base.ignored_fields, (std::vector<std::string>{"thinking", "service_tier"}));
  // count_tokens needs no max_tokens.
  m = ok(std::string("{") + kUser + "}", /*count_only=*/true);
  EXPECT_EQ(m.base.messages.size(), 1u);
}

TEST(AnthropicApi, ToolChoiceMapsOntoTheChatPath) {
  const std::string tools =
      R"(,"tools":[{"name":"a","input_schema":{"type":"object"}},{"name":"b","input_schema":{"type":"object"}}])";
  EXPECT_EQ(ok(with(tools + R"(,"tool_choice":{"type":"any"})")).base.constraint.tools.choice, ToolChoice::kRequired);
  auto named = ok(with(tools + R"(,"tool_choice":{"type":"tool","name":"b","disable_parallel_tool_use":true})"));
  EXPECT_EQ(named.base.constraint.tools.choice, ToolChoice::kNamed);
  EXPECT_EQ(named.base.constraint.tools.named, "b");
  EXPECT_EQ(ok(with(tools + R"(,"tool_choice":{"type":"none"})")).base.constraint.tools.choice, ToolChoice::kNone);
  EXPECT_EQ(ok(with(tools)).base.constraint.tools.choice, ToolChoice::kAuto);
  EXPECT_FALSE(ok(with(R"(,"tool_choice":{"type":"auto"})")).base.constraint.tools.active());
}

TEST(AnthropicApi, CacheControlBreakpoints) {
  // On a system block: the prefix is the system message so far, with every tool.
  auto m = ok(R"({"max_tokens":4,"tools":[{"name":"f","input_schema":{"type":"object"}}],
      "system":[{"type":"text","text":"S1","cache_control":{"type":"ephemeral"}},{"type":"text","text":"S2"}],
      "messages":[{"role":"user","content":"q"}]})");
  ASSERT_TRUE(m.cache.present);
  EXPECT_EQ(m.cache.ttl_s, 300);
  EXPECT_EQ(m.base.params.pin_ttl_s, 300);
  EXPECT_EQ(m.cache.field, "system[0].cache_control");
  ASSERT_EQ(m.cache.messages.size(), 1u);
  EXPECT_EQ(m.cache.messages[0].content, "S1");
  EXPECT_EQ(m.cache.tools.size(), 1u);
  EXPECT_EQ(m.base.messages[0].content, "S1S2");

  // The last breakpoint wins, with its ttl; the cut is right after its block.
  m = ok(R"({"max_tokens":4,"system":[{"type":"text","text":"S","cache_control":{"type":"ephemeral","ttl":"5m"}}],
      "messages":[{"role":"user","content":[{"type":"text","text":"u1"},
                   {"type":"text","text":"u2","cache_control":{"type":"ephemeral","ttl":"1h"}},
                   {"type":"text","text":"u3"}]},
                  {"role":"assistant","content":"a"},{"role":"user","content":"q"}]})");
  ASSERT_TRUE(m.cache.present);
  EXPECT_EQ(m.cache.ttl_s, 3600);
  EXPECT_EQ(m.base.params.pin_ttl_s, 3600);
  EXPECT_EQ(m.cache.field, "messages[0].content[1].cache_control");
  ASSERT_EQ(m.cache.messages.size(), 2u);
  EXPECT_EQ(m.cache.messages[1].role, "user");
  EXPECT_EQ(m.cache.messages[1].content, "u1u2");
  EXPECT_TRUE(m.cache.tools.is_null());

  // On a tool: the tools up to it, no messages.
  m = ok(R"({"max_tokens":4,"tools":[{"name":"f","input_schema":{"type":"object"},"cache_control":{"type":"ephemeral"}},
      {"name":"g","input_schema":{"type":"object"}}],"messages":[{"role":"user","content":"q"}]})");
  ASSERT_TRUE(m.cache.present);
  EXPECT_EQ(m.cache.tools.size(), 1u);
  EXPECT_TRUE(m.cache.messages.empty());
  EXPECT_EQ(m.cache.field, "tools[0].cache_control");

  // Top-level cache_control (automatic caching): the breakpoint is the last block.
  m = ok(R"({"max_tokens":4,"cache_control":{"type":"ephemeral","ttl":"1h"},"messages":[{"role":"user","content":"q"},
      {"role":"assistant","content":"a"},{"role":"user","content":"r"}]})");
  ASSERT_TRUE(m.cache.present);
  EXPECT_EQ(m.cache.field, "cache_control");
  EXPECT_EQ(m.cache.ttl_s, 3600);
  ASSERT_EQ(m.cache.messages.size(), 3u);
  EXPECT_EQ(m.cache.messages[2].content, "r");
  EXPECT_EQ(err(R"({"max_tokens":4,"cache_control":{"type":"ephemeral","ttl":"2h"},"messages":[{"role":"user","content":"q"}]})").param,
            "cache_control.ttl");

  // On a tool_result and a tool_use block.
  m = ok(R"({"max_tokens":4,"messages":[{"role":"user","content":"q"},
      {"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"f","input":{},"cache_control":{"type":"ephemeral"}}]},
      {"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"r","cache_control":{"type":"ephemeral"}}]}]})");
  ASSERT_EQ(m.cache.messages.size(), 3u);
  EXPECT_EQ(m.cache.messages[2].role, "tool");
  EXPECT_EQ(m.cache.field, "messages[2].content[0].cache_control");
}

TEST(AnthropicApi, BadValuesNameTheField) {
  const std::string sys = R"({"max_tokens":4,"messages":[{"role":"user","content":"q"}],"system":[{"type":"text","text":"S",)";
  struct Case { std::string body, field; };
  const Case cases[] = {
      {std::string("{") + kUser + "}", "max_tokens"},
      {std::string("{") + kUser + R"(,"max_tokens":0})", "max_tokens"},
      {std::string("{") + kUser + R"(,"max_tokens":"8"})", "max_tokens"},
      {with(R"(,"temperature":1.5)"), "temperature"},
      {with(R"(,"temperature":"hot")"), "temperature"},
      {with(R"(,"top_p":0)"), "top_p"},
      {with(R"(,"top_k":-1)"), "top_k"},
      {with(R"(,"top_k":2.5)"), "top_k"},
      {with(R"(,"stream":"yes")"), "stream"},
      {with(R"(,"stop_sequences":"END")"), "stop_sequences"},
      {with(R"(,"stop_sequences":[""])"), "stop_sequences"},
      {with(R"(,"stop_sequences":[1])"), "stop_sequences"},
      {with(R"(,"metadata":"u")"), "metadata"},
      {with(R"(,"metadata":{"user_id":5})"), "metadata.user_id"},
      {with(R"(,"metadata":{"tenant":"x"})"), "metadata.tenant"},
      {with(R"(,"priority":2147483648)"), "priority"},
      {with(R"(,"model":5)"), "model"},
      {with(R"(,"system":5)"), "system"},
      {with(R"(,"system":[{"type":"image"}])"), "system[0]"},
      {with(R"(,"tools":{})"), "tools"},
      {with(R"(,"tools":[{"name":"f"}])"), "tools[0].input_schema"},
      {with(R"(,"tools":[{"type":"bash_20250124","name":"bash"}])"), "tools[0].type"},
      {with(R"(,"tools":[{"name":"bad name!","input_schema":{"type":"object"}}])"), "tools"},
      {with(R"(,"tool_choice":"auto")"), "tool_choice"},
      {with(R"(,"tool_choice":{"type":"sometimes"})"), "tool_choice.type"},
      {with(R"(,"tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"tool"})"),
       "tool_choice.name"},
      {with(R"(,"tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"tool","name":"g"})"),
       "tool_choice"},
      {with(R"(,"tool_choice":{"type":"any"})"), "tool_choice"},
      {R"({"max_tokens":4})", "messages"},
      {R"({"max_tokens":4,"messages":[]})", "messages"},
      {R"({"max_tokens":4,"messages":[{"role":"system","content":"s"}]})", "messages[0].role"},
      {R"({"max_tokens":4,"messages":[{"role":"user"}]})", "messages[0].content"},
      {R"({"max_tokens":4,"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"pre"}]})",
       "messages[1].role"},
      {R"({"max_tokens":4,"messages":[{"role":"user","content":[{"type":"image","source":{}}]}]})",
       "messages[0].content[0].type"},
      {R"({"max_tokens":4,"messages":[{"role":"user","content":[{"type":"tool_use","id":"a","name":"f","input":{}}]}]})",
       "messages[0].content[0].type"},
      {R"({"max_tokens":4,"messages":[{"role":"user","content":[{"type":"tool_result"}]}]})",
       "messages[0].content[0].tool_use_id"},
      {R"({"max_tokens":4,"messages":[{"role":"user","content":"q"},{"role":"assistant","content":[{"type":"tool_use","id":"a","name":"f","input":"{}"}]},{"role":"user","content":"r"}]})",
       "messages[1].content[0].input"},
      {R"({"max_tokens":4,"messages":[{"role":"user","content":[{"type":"text"}]}]})", "messages[0].content[0].text"},
      // cache_control: a type, a ttl that does not parse, a ttl other than 5m/1h,
      // and blocks that cannot end a prefix.
      {sys + R"("cache_control":{"type":"persistent"}}]})", "system[0].cache_control.type"},
      {sys + R"("cache_control":{"type":"ephemeral","ttl":"10m"}}]})", "system[0].cache_control.ttl"},
      {sys + R"("cache_control":{"type":"ephemeral","ttl":"forever"}}]})", "system[0].cache_control.ttl"},
      {sys + R"("cache_control":{"type":"ephemeral","ttl":300}}]})", "system[0].cache_control.ttl"},
      {sys + R"("cache_control":"ephemeral"}]})", "system[0].cache_control"},
      {R"({"max_tokens":4,"messages":[{"role":"user","content":[{"type":"text","text":"","cache_control":{"type":"ephemeral"}}]}]})",
       "messages[0].content[0].cache_control"},
      {R"({"max_tokens":4,"messages":[{"role":"user","content":"q"},{"role":"assistant","content":[{"type":"thinking","thinking":"t","cache_control":{"type":"ephemeral"}}]},{"role":"user","content":"r"}]})",
       "messages[1].content[0].cache_control"},
      {R"({"max_tokens":4,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"a","content":[{"type":"text","text":"x","cache_control":{"type":"ephemeral"}}]}]}]})",
       "messages[0].content[0].content[0].cache_control"},
  };
  for (const Case& c : cases) {
    ApiError e = err(c.body);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.field) << c.body << " -> " << e.message;
    EXPECT_NE(e.message.find(c.field.substr(0, c.field.find('['))), std::string::npos) << e.message;
  }
  // At most four breakpoints; the fifth is named.
  std::string five = R"({"max_tokens":4,"messages":[{"role":"user","content":[)";
  for (int i = 0; i < 5; ++i) {
    if (i) five += ",";
    five += R"({"type":"text","text":"x","cache_control":{"type":"ephemeral"}})";
  }
  five += "]}]}";
  EXPECT_EQ(err(five).param, "messages[0].content[4].cache_control");
  EXPECT_EQ(err("[1]").status, 400);
  EXPECT_EQ(err("{").status, 400);
}

TEST(AnthropicApi, UsageSumsToThePrompt) {
  // No breakpoint: what was not read is input.
  MessagesUsage u = messages_usage(100, 32, 0, 7);
  EXPECT_EQ(u.cache_read_input_tokens, 32);
  EXPECT_EQ(u.cache_creation_input_tokens, 0);
  EXPECT_EQ(u.input_tokens, 68);
  EXPECT_EQ(u.output_tokens, 7);
  // First request with a breakpoint at 80: the prefix is created.
  u = messages_usage(100, 0, 80, 1);
  EXPECT_EQ(u.cache_creation_input_tokens, 80);
  EXPECT_EQ(u.input_tokens, 20);
  // Second: part of it read, the rest of the prefix created.
  u = messages_usage(100, 64, 80, 1);
  EXPECT_EQ(u.cache_read_input_tokens, 64);
  EXPECT_EQ(u.cache_creation_input_tokens, 16);
  EXPECT_EQ(u.input_tokens, 20);
  // Read past the breakpoint: nothing created.
  u = messages_usage(100, 96, 80, 1);
  EXPECT_EQ(u.cache_creation_input_tokens, 0);
  EXPECT_EQ(u.input_tokens, 4);
  for (int64_t cached : {0, 16, 50, 99, 100})
    for (int64_t pin : {0, 10, 99, 100}) {
      u = messages_usage(100, cached, pin, 0);
      EXPECT_EQ(u.input_tokens + u.cache_creation_input_tokens + u.cache_read_input_tokens, 100);
      EXPECT_GE(u.input_tokens, 0);
    }
  auto j = usage_json(messages_usage(10, 0, 4, 2));
  EXPECT_EQ(j.dump(), R"({"cache_creation_input_tokens":4,"cache_read_input_tokens":0,"input_tokens":6,"output_tokens":2})");
}

TEST(AnthropicApi, ErrorShapes) {
  auto body = [](int status) {
    return nlohmann::json::parse(anthropic_error_body(ApiError{status, "m", "x", "p", "c"}));
  };
  EXPECT_EQ(body(400)["type"], "error");
  EXPECT_EQ(body(400)["error"]["type"], "invalid_request_error");
  EXPECT_EQ(body(400)["error"]["message"], "m");
  EXPECT_EQ(body(401)["error"]["type"], "authentication_error");
  EXPECT_EQ(body(404)["error"]["type"], "not_found_error");
  EXPECT_EQ(body(503)["error"]["type"], "overloaded_error");
  EXPECT_EQ(body(500)["error"]["type"], "api_error");
  EXPECT_EQ(anthropic_status(ApiError{503, "", "", "", ""}), 529);
  EXPECT_EQ(anthropic_status(ApiError{400, "", "", "", ""}), 400);
  EXPECT_EQ(anthropic_sse("ping", nlohmann::json{{"type", "ping"}}), "event: ping\ndata: {\"type\":\"ping\"}\n\n");
}

// ---- OpenAI: priority, prompt_cache_retention, prompt_cache_key -----------------

TEST(CacheFields, Durations) {
  EXPECT_EQ(parse_duration_s("300s"), 300);
  EXPECT_EQ(parse_duration_s("30m"), 1800);
  EXPECT_EQ(parse_duration_s("1h"), 3600);
  EXPECT_EQ(parse_duration_s("24h"), 86400);
  EXPECT_EQ(parse_duration_s("7d"), 7 * 86400);
  for (const char* s : {"", "h", "0s", "1.5h", "-1h", "1 h", "8d", "169h", "1w", "1hh", "99999999999s", "1H"})
    EXPECT_FALSE(parse_duration_s(s).has_value()) << s;
}

TEST(CacheFields, OpenAiFieldsOnBothEndpoints) {
  for (Endpoint ep : {Endpoint::kCompletions, Endpoint::kChat}) {
    const std::string head = ep == Endpoint::kChat ? R"({"messages":[{"role":"user","content":"q"}])" : R"({"prompt":"q")";
    auto parse = [&](const std::string& fields) { return parse_request(ep, head + fields + "}"); };
    auto good = [&](const std::string& fields) {
      auto r = parse(fields);
      if (auto* e = std::get_if<ApiError>(&r)) ADD_FAILURE() << fields << " -> " << e->message;
      return std::get_if<ParsedRequest>(&r) ? std::get<ParsedRequest>(r) : ParsedRequest{};
    };
    ParsedRequest r = good("");
    EXPECT_EQ(r.params.priority, 0);
    EXPECT_FALSE(r.cache.pin_prompt);
    EXPECT_EQ(r.params.pin_ttl_s, 0);
    EXPECT_EQ(good(R"(,"priority":-2147483648)").params.priority, INT32_MIN);
    EXPECT_EQ(good(R"(,"priority":2147483647)").params.priority, INT32_MAX);
    EXPECT_EQ(good(R"(,"priority":10)").params.priority, 10);
    EXPECT_EQ(good(R"(,"priority":3.0)").params.priority, 3);
    r = good(R"(,"prompt_cache_retention":"in_memory","prompt_cache_key":"conv-7")");
    EXPECT_TRUE(r.cache.pin_prompt);
    EXPECT_EQ(r.params.pin_ttl_s, kInMemoryRetentionS);
    EXPECT_EQ(r.cache.prompt_cache_key, "conv-7");
    EXPECT_TRUE(r.ignored_fields.empty());
    EXPECT_EQ(good(R"(,"prompt_cache_retention":"24h")").params.pin_ttl_s, 86400);
    EXPECT_EQ(good(R"(,"prompt_cache_retention":"30m")").params.pin_ttl_s, 1800);
    EXPECT_EQ(good(R"(,"prompt_cache_retention":"300s")").params.pin_ttl_s, 300);
    EXPECT_EQ(good(R"(,"prompt_cache_retention":null)").params.pin_ttl_s, 0);
    struct Case { std::string fields, param; };
    const Case bad[] = {
        {R"(,"priority":2147483648)", "priority"},  {R"(,"priority":-2147483649)", "priority"},
        {R"(,"priority":"1")", "priority"},         {R"(,"priority":1.5)", "priority"},
        {R"(,"priority":true)", "priority"},        {R"(,"priority":1e300)", "priority"},
        {R"(,"prompt_cache_retention":"forever")", "prompt_cache_retention"},
        {R"(,"prompt_cache_retention":"0s")", "prompt_cache_retention"},
        {R"(,"prompt_cache_retention":"8d")", "prompt_cache_retention"},
        {R"(,"prompt_cache_retention":300)", "prompt_cache_retention"},
        {R"(,"prompt_cache_key":5)", "prompt_cache_key"},
        {R"(,"prompt_cache_key":")" + std::string(kMaxPromptCacheKeyBytes + 1, 'k') + "\"", "prompt_cache_key"},
    };
    for (const Case& c : bad) {
      auto res = parse(c.fields);
      ASSERT_TRUE(std::holds_alternative<ApiError>(res)) << c.fields;
      EXPECT_EQ(std::get<ApiError>(res).status, 400);
      EXPECT_EQ(std::get<ApiError>(res).param, c.param) << c.fields;
      EXPECT_NE(std::get<ApiError>(res).message.find(c.param), std::string::npos);
    }
    for (const char* f : {"priority", "prompt_cache_retention", "prompt_cache_key"}) EXPECT_TRUE(is_known_field(ep, f));
  }
}

// ---- cache_control -> the token position of the breakpoint ------------------------

class CachePrefix : public ::testing::Test {
 protected:
  // A ChatML-like template over the tiny test vocabulary (its markers are plain text there).
  static void SetUpTestSuite() {
    auto file = pagoda::gguf::GgufFile::open(std::string(PAGODA_TEST_DATA) + "/stories260K.gguf");
    ASSERT_TRUE(file.ok());
    auto tk = pagoda::tok::Tokenizer::from_gguf(**file);
    ASSERT_TRUE(tk.ok());
    const std::string tmpl =
        "{% for m in messages %}{{ '<s>' + m['role'] + ': ' + m['content'] + '</s>\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<s>assistant: ' }}{% endif %}";
    auto c = TextCodec::create(**tk, tmpl);
    ASSERT_TRUE(c.ok()) << c.message();
    codec_ = std::move(c).value().release();
  }
  static void TearDownTestSuite() { delete codec_; }
  static std::vector<int32_t> prompt(const MessagesRequest& m) {
    auto ids = codec_->encode_chat(m.base.messages, false, m.base.constraint.tools.tools);
    EXPECT_TRUE(ids.ok());
    return ids.ok() ? *ids : std::vector<int32_t>{};
  }
  static TextCodec* codec_;
};
TextCodec* CachePrefix::codec_ = nullptr;

TEST_F(CachePrefix, EndOfATurnIsAnExactPrefix) {
  auto m = ok(R"({"max_tokens":4,"system":[{"type":"text","text":"Once upon a time","cache_control":{"type":"ephemeral"}}],
      "messages":[{"role":"user","content":"there was a cat"},{"role":"assistant","content":"and a dog"},
                  {"role":"user","content":[{"type":"text","text":"They played.","cache_control":{"type":"ephemeral"}}]},
                  {"role":"assistant","content":"ok"},{"role":"user","content":"The end"}]})");
  const std::vector<int32_t> full = prompt(m);
  bool exact = false;
  const int32_t pin = cache_prefix_tokens(*codec_, m.cache, full, false, &exact);
  EXPECT_TRUE(exact);
  // The conversation up to the fourth message (the last breakpoint), alone.
  std::vector<ChatMessage> head(m.base.messages.begin(), m.base.messages.begin() + 4);
  auto want = codec_->encode_chat(head, false, nullptr, /*add_generation_prompt=*/false);
  ASSERT_TRUE(want.ok());
  EXPECT_EQ(pin, static_cast<int32_t>(want->size()));
  ASSERT_LT(static_cast<size_t>(pin), full.size());
  EXPECT_TRUE(std::equal(want->begin(), want->end(), full.begin()));
  // Without a breakpoint: nothing pinned.
  EXPECT_EQ(cache_prefix_tokens(*codec_, CacheBreakpoint{}, full, false), 0);
}

TEST_F(CachePrefix, InsideAMessageFallsBackToTheCommonPrefix) {
  auto m = ok(R"({"max_tokens":4,"messages":[{"role":"user","content":[
      {"type":"text","text":"Once upon a time","cache_control":{"type":"ephemeral","ttl":"1h"}},
      {"type":"text","text":" there was a cat"}]}]})");
  const std::vector<int32_t> full = prompt(m);
  bool exact = true;
  const int32_t pin = cache_prefix_tokens(*codec_, m.cache, full, false, &exact);
  // The cut rendering ends "Once upon a time</s>", the full one goes on with " there":
  // what they share is kept.
  EXPECT_FALSE(exact);
  auto cut = codec_->encode_chat(m.cache.messages, false, nullptr, false);
  ASSERT_TRUE(cut.ok());
  size_t lcp = 0;
  while (lcp < cut->size() && lcp < full.size() && (*cut)[lcp] == full[lcp]) ++lcp;
  EXPECT_EQ(pin, static_cast<int32_t>(lcp));
  EXPECT_LT(static_cast<size_t>(pin), cut->size());
  // It covers the text up to the breakpoint: only the cut's end-of-turn marker ("</s>\n") differs.
  EXPECT_GE(static_cast<size_t>(pin) + 3, cut->size());
  EXPECT_EQ(m.base.params.pin_ttl_s, 3600);
}
