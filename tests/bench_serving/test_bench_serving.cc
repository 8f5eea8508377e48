// Serving benchmark: workload generators, percentiles, SSE and chunk parsing, and
// real runs on stories260K offline and against an in-process pagoda server.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "cli/command.h"
#include "cli/engine_flags.h"
#include "engine/engine.h"
#include "gguf/gguf.h"
#include "loadgen/http_client.h"
#include "loadgen/report.h"
#include "loadgen/serving.h"
#include "loadgen/workload.h"
#include "server/server.h"
#include "tok/tokenizer.h"

// The CLI's main.cc defines these; the test links the benchmark sources without it.
namespace pagoda::cli {
std::vector<Command>& registry() {
  static std::vector<Command> r;
  return r;
}
std::string default_model_path() { return PAGODA_TEST_DATA "/stories260K.gguf"; }
}  // namespace pagoda::cli

namespace pagoda::cli::bench {
using namespace ::pagoda::loadgen;  // the benchmark moved to src/loadgen/ (issue 34)
namespace {

const std::string kStories = PAGODA_TEST_DATA "/stories260K.gguf";

// Engine flags under vLLM's and llama.cpp's names: --max-model-len = -c,
// -np / --parallel = --max-num-seqs, --kv-cache-dtype and -ctk/-ctv = --kv-dtype.
TEST(EngineFlags, VllmAndLlamaCppNames) {
  const auto parse = [](std::vector<std::string> words, engine::EngineConfig* cfg) {
    words.insert(words.begin(), "pagoda");
    std::vector<char*> argv;
    for (std::string& w : words) argv.push_back(w.data());
    Args args(static_cast<int>(argv.size()), argv.data());
    std::string err = parse_engine_flags(args, cfg);
    if (err.empty()) err = args.leftover();
    return err;
  };
  engine::EngineConfig c;
  ASSERT_EQ(parse({"--max-model-len", "512", "-np", "3", "--kv-cache-dtype", "q8_0"}, &c), "");
  EXPECT_EQ(c.context_length, 512);
  EXPECT_EQ(c.max_num_seqs, 3);
  EXPECT_EQ(c.kv_dtype, engine::KvDtype::Q8_0);
  engine::EngineConfig d;
  ASSERT_EQ(parse({"--parallel", "5", "-ctk", "bf16", "-ctv", "bf16"}, &d), "");
  EXPECT_EQ(d.max_num_seqs, 5);
  EXPECT_EQ(d.kv_dtype, engine::KvDtype::BF16);
  engine::EngineConfig e;
  ASSERT_EQ(parse({"--kv-cache-dtype", "auto"}, &e), "");
  EXPECT_EQ(e.kv_dtype, engine::KvDtype::F16);
  engine::EngineConfig f;  // llama.cpp's -ctk / -ctv: K's and V's type each (f16 unless given)
  ASSERT_EQ(parse({"-ctk", "q4_0", "-ctv", "q8_0"}, &f), "");
  EXPECT_EQ(f.kv_dtype, KvTypes(KvDtype::Q4_0, KvDtype::Q8_0));
  ASSERT_EQ(parse({"--cache-type-v", "iq4_nl"}, &f), "");
  EXPECT_EQ(f.kv_dtype, KvTypes(KvDtype::F16, KvDtype::IQ4_NL));
  ASSERT_EQ(parse({"--kv-cache-dtype", "q5_1"}, &f), "");
  EXPECT_EQ(f.kv_dtype, KvTypes(KvDtype::Q5_1));
  EXPECT_NE(parse({"-ctk", "q3_0"}, &f).find("'q3_0' for -ctk/--cache-type-k"), std::string::npos);
  EXPECT_NE(parse({"-ctv", "q4"}, &f).find("'q4' for -ctv/--cache-type-v"), std::string::npos);
  EXPECT_NE(parse({"--kv-cache-dtype", "fp8"}, &f).find("--kv-dtype/--kv-cache-dtype"), std::string::npos);
  EXPECT_EQ(f.kv_dtype, KvTypes(KvDtype::Q5_1));  // a bad flag changes nothing
  engine::EngineConfig h;  // vLLM's name for one full-context KV group
  EXPECT_FALSE(h.disable_hybrid_kv_cache_manager);
  ASSERT_EQ(parse({"--disable-hybrid-kv-cache-manager"}, &h), "");
  EXPECT_TRUE(h.disable_hybrid_kv_cache_manager);
  engine::EngineConfig k;  // hybrid models' state checkpoints (issue 38): every 4 blocks unless given
  EXPECT_EQ(k.state_checkpoint_interval, 4);
  ASSERT_EQ(parse({"--state-checkpoint-interval", "1"}, &k), "");
  EXPECT_EQ(k.state_checkpoint_interval, 1);
  ASSERT_EQ(parse({"--state-checkpoint-interval=0"}, &k), "");
  EXPECT_EQ(k.state_checkpoint_interval, 0);
  for (const char* bad : {"-1", "x", "2.5", "2000000"}) {
    EXPECT_NE(parse({"--state-checkpoint-interval", bad}, &k).find("--state-checkpoint-interval must be an integer in 0.."),
              std::string::npos)
        << bad;
  }
  EXPECT_EQ(k.state_checkpoint_interval, 0);  // a bad value changes nothing
}

TokenSpace small_space() {
  TokenSpace s;
  s.bos = 1;
  for (int32_t i = 3; i < 100; ++i) s.ordinary.push_back(i);
  return s;
}

// ---- Workloads ---------------------------------------------------------------

TEST(Workload, RandomExactLengthsAndDeterministic) {
  const TokenSpace space = small_space();
  auto a = make_random_workload(space, 20, 32, 16, 0.0, 7);
  auto b = make_random_workload(space, 20, 32, 16, 0.0, 7);
  auto c = make_random_workload(space, 20, 32, 16, 0.0, 8);
  ASSERT_EQ(a.size(), 20u);
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].prompt.size(), 32u) << i;
    EXPECT_EQ(a[i].max_tokens, 16);
    EXPECT_EQ(a[i].prompt[0], 1);  // BOS counts in the length
    for (size_t k = 1; k < a[i].prompt.size(); ++k) {
      EXPECT_GE(a[i].prompt[k], 3);
      EXPECT_LT(a[i].prompt[k], 100);
    }
    EXPECT_EQ(a[i].prompt, b[i].prompt);
    EXPECT_EQ(a[i].max_tokens, b[i].max_tokens);
  }
  EXPECT_NE(a[0].prompt, a[1].prompt);
  EXPECT_NE(a[0].prompt, c[0].prompt);
}

TEST(Workload, RandomRangeRatio) {
  TokenSpace space = small_space();
  space.bos = -1;
  auto reqs = make_random_workload(space, 200, 40, 10, 0.5, 3);
  std::set<size_t> in_lens;
  std::set<int32_t> out_lens;
  for (const auto& r : reqs) {
    EXPECT_GE(r.prompt.size(), 20u);
    EXPECT_LE(r.prompt.size(), 60u);
    EXPECT_GE(r.max_tokens, 5);
    EXPECT_LE(r.max_tokens, 15);
    EXPECT_NE(r.prompt[0], 1);  // no BOS when the model adds none
    in_lens.insert(r.prompt.size());
    out_lens.insert(r.max_tokens);
  }
  EXPECT_GT(in_lens.size(), 20u);
  EXPECT_EQ(out_lens.size(), 11u);  // every length in 5..15 drawn over 200 requests
}

TEST(Workload, SharedPrefixGroupsAreExact) {
  const TokenSpace space = small_space();
  auto reqs = make_shared_prefix_workload(space, 3, 4, 10, 5, 7, 11);
  auto again = make_shared_prefix_workload(space, 3, 4, 10, 5, 7, 11);
  ASSERT_EQ(reqs.size(), 12u);
  std::map<std::vector<int32_t>, int> prefixes;
  std::set<std::vector<int32_t>> suffixes;
  std::vector<std::vector<int32_t>> order;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const auto& r = reqs[i];
    ASSERT_EQ(r.prompt.size(), 15u);
    EXPECT_EQ(r.prompt[0], 1);
    EXPECT_EQ(r.max_tokens, 7);
    EXPECT_EQ(r.prompt, again[i].prompt);
    std::vector<int32_t> pre(r.prompt.begin(), r.prompt.begin() + 10);
    prefixes[pre]++;
    suffixes.insert(std::vector<int32_t>(r.prompt.begin() + 10, r.prompt.end()));
    order.push_back(pre);
  }
  ASSERT_EQ(prefixes.size(), 3u);
  for (const auto& [p, count] : prefixes) EXPECT_EQ(count, 4);
  EXPECT_EQ(suffixes.size(), 12u);
  // Shuffled: the requests of a group are not all adjacent.
  int changes = 0;
  for (size_t i = 1; i < order.size(); ++i) changes += order[i] != order[i - 1];
  EXPECT_GT(changes, 2);
}

TEST(Workload, TokenSpaceOfStories) {
  auto f = gguf::GgufFile::open(kStories);
  ASSERT_TRUE(f.ok()) << f.message();
  auto tk = tok::Tokenizer::from_gguf(**f);
  ASSERT_TRUE(tk.ok()) << tk.message();
  const TokenSpace s = token_space(**tk);
  EXPECT_EQ(s.bos, (*tk)->bos_id());
  std::set<int32_t> ids(s.ordinary.begin(), s.ordinary.end());
  EXPECT_EQ(ids.count((*tk)->bos_id()), 0u);
  EXPECT_EQ(ids.count((*tk)->eos_id()), 0u);
  EXPECT_EQ(ids.count((*tk)->unk_id()), 0u);
  for (int32_t id : s.ordinary) EXPECT_FALSE((*tk)->is_control(id)) << id;
  EXPECT_EQ(static_cast<int32_t>(s.ordinary.size()), (*tk)->vocab_size() - 3);
}

TEST(Workload, DatasetLoads) {
  auto f = gguf::GgufFile::open(kStories);
  ASSERT_TRUE(f.ok());
  auto tk = tok::Tokenizer::from_gguf(**f);
  ASSERT_TRUE(tk.ok());
  const std::string path = testing::TempDir() + "bench_dataset.jsonl";
  {
    std::ofstream o(path);
    o << "{\"prompt\": \"Once upon a time\", \"max_tokens\": 5}\n\n"
      << "{\"prompt\": \"The cat\"}\n"
      << "{\"prompt\": \"third\", \"max_tokens\": 9}\n";
  }
  auto d = load_dataset(path, **tk, 33, 2);
  ASSERT_TRUE(d.ok()) << d.message();
  ASSERT_EQ(d->size(), 2u);
  EXPECT_EQ((*d)[0].prompt, (*tk)->encode("Once upon a time", true, true));
  EXPECT_EQ((*d)[0].max_tokens, 5);
  EXPECT_EQ((*d)[1].max_tokens, 33);
  auto all = load_dataset(path, **tk, 33, 0);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 3u);
  {
    std::ofstream o(path);
    o << "{\"prompt\": \"ok\"}\n{\"max_tokens\": 3}\n";
  }
  auto bad = load_dataset(path, **tk, 33, 0);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("line 2"), std::string::npos) << bad.message();
  std::remove(path.c_str());
}

TEST(Workload, ArrivalTimes) {
  auto inf = arrival_times(5, std::numeric_limits<double>::infinity(), 1);
  EXPECT_EQ(inf, std::vector<double>(5, 0.0));
  auto a = arrival_times(4000, 10.0, 5);
  EXPECT_EQ(a, arrival_times(4000, 10.0, 5));
  EXPECT_EQ(a[0], 0.0);
  for (size_t i = 1; i < a.size(); ++i) ASSERT_GE(a[i], a[i - 1]);
  const double mean_gap = a.back() / 3999.0;
  EXPECT_NEAR(mean_gap, 0.1, 0.01);
}

// ---- Metrics -----------------------------------------------------------------

TEST(Metrics, PercentileInterpolatesLikeNumpy) {
  EXPECT_DOUBLE_EQ(percentile({4, 1, 3, 2}, 50), 2.5);
  EXPECT_DOUBLE_EQ(percentile({4, 1, 3, 2}, 99), 3.97);
  EXPECT_DOUBLE_EQ(percentile({4, 1, 3, 2}, 0), 1.0);
  EXPECT_DOUBLE_EQ(percentile({4, 1, 3, 2}, 100), 4.0);
  EXPECT_DOUBLE_EQ(percentile({7}, 99), 7.0);
  EXPECT_DOUBLE_EQ(percentile({}, 50), 0.0);
  EXPECT_DOUBLE_EQ(percentile({10, 20, 30}, 25), 15.0);
}

TEST(Metrics, SummarizeExactValues) {
  std::vector<RequestResult> rs(3);
  rs[0].ok = true;
  rs[0].ttft = 0.1;
  rs[0].e2e = 0.5;
  rs[0].itl = {0.2, 0.2};
  rs[0].prompt_tokens = 10;
  rs[0].output_tokens = 3;
  rs[0].cached_tokens = 0;
  rs[0].ids_known = true;
  rs[0].output_ids = {5, 6, 7};
  rs[0].text = "abc";
  rs[1] = rs[0];
  rs[1].ttft = 0.3;
  rs[1].e2e = 0.3;
  rs[1].itl = {};
  rs[1].output_tokens = 1;
  rs[1].output_ids = {9};
  rs[1].cached_tokens = 5;
  rs[2].error = "boom";
  RunExtras ex;
  ex.duration = 2.0;
  ex.peak_kv_usage = 0.25;
  ex.num_preemptions = 0;
  Summary s = summarize(rs, ex);
  EXPECT_EQ(s.completed, 2);
  EXPECT_EQ(s.failed, 1);
  EXPECT_EQ(s.first_error, "boom");
  EXPECT_EQ(s.total_input_tokens, 20);
  EXPECT_EQ(s.total_output_tokens, 4);
  EXPECT_DOUBLE_EQ(s.request_throughput, 1.0);
  EXPECT_DOUBLE_EQ(s.output_tokens_per_s, 2.0);
  EXPECT_DOUBLE_EQ(s.total_tokens_per_s, 12.0);
  EXPECT_DOUBLE_EQ(s.ttft_ms_mean, 200.0);
  EXPECT_DOUBLE_EQ(s.tpot_ms_mean, 200.0);  // only request 0: (0.5 - 0.1) / 2
  EXPECT_DOUBLE_EQ(s.itl_ms_p50, 200.0);
  EXPECT_DOUBLE_EQ(s.prefix_hit_rate, 0.25);
  EXPECT_TRUE(s.output_hash_known);
  EXPECT_EQ(s.steady_decode_tokens_per_s, -1);

  // A changed token or text changes the hashes; a request of unknown ids hides the id hash.
  std::vector<RequestResult> changed = rs;
  changed[1].output_ids = {8};
  EXPECT_NE(summarize(changed, ex).output_hash, s.output_hash);
  EXPECT_EQ(summarize(changed, ex).output_text_hash, s.output_text_hash);
  changed[1].text = "abd";
  EXPECT_NE(summarize(changed, ex).output_text_hash, s.output_text_hash);
  changed[1].ids_known = false;
  changed[1].cached_tokens = -1;
  Summary u = summarize(changed, ex);
  EXPECT_FALSE(u.output_hash_known);
  EXPECT_EQ(u.prefix_hit_rate, -1);

  const std::string report = format_report(s);
  EXPECT_NE(report.find("============ Serving Benchmark Result ============"), std::string::npos) << report;
  EXPECT_NE(report.find("Successful requests:                     2\n"), std::string::npos) << report;
  EXPECT_NE(report.find("Prefix cache hit rate (%):               25.00\n"), std::string::npos) << report;
  const std::string js = format_json(s);
  EXPECT_NE(js.find("\"completed\":2"), std::string::npos) << js;
  EXPECT_NE(js.find("\"steady_decode_tokens_per_s\":null"), std::string::npos) << js;
}

// ---- SSE and chunks ----------------------------------------------------------

std::vector<std::string> sse_events(const std::vector<std::string>& pieces) {
  std::vector<std::string> out;
  SseParser p;
  for (const auto& s : pieces) p.feed(s, [&](const std::string& d) { out.push_back(d); });
  p.finish([&](const std::string& d) { out.push_back(d); });
  return out;
}

TEST(Sse, EventsSurviveAnySplit) {
  const std::string stream =
      ": keep-alive comment\r\n\r\n"
      "data: {\"a\":1}\n\n"
      "event: message\r\ndata: {\"b\":\r\ndata:2}\r\n\r\n"
      "id: 3\ndata:  two spaces\n\n"
      "data: [DONE]\n\n";
  const std::vector<std::string> want = {"{\"a\":1}", "{\"b\":\n2}", " two spaces", "[DONE]"};
  EXPECT_EQ(sse_events({stream}), want);
  std::vector<std::string> bytes;
  for (char c : stream) bytes.push_back(std::string(1, c));
  EXPECT_EQ(sse_events(bytes), want);
  for (size_t cut = 0; cut <= stream.size(); ++cut)
    ASSERT_EQ(sse_events({stream.substr(0, cut), stream.substr(cut)}), want) << "cut at " << cut;
  // A last event without its blank line is still delivered at the end of the stream.
  EXPECT_EQ(sse_events({"data: x\n"}), std::vector<std::string>{"x"});
}

TEST(Sse, ParsesCompletionChunks) {
  StreamChunk c = parse_stream_chunk(
      R"({"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" cat","logprobs":null,"finish_reason":null}]})");
  EXPECT_FALSE(c.error);
  EXPECT_TRUE(c.has_choice);
  EXPECT_EQ(c.text, " cat");
  EXPECT_FALSE(c.finished);
  c = parse_stream_chunk(R"({"choices":[{"text":"","token_ids":[5,6],"finish_reason":"length"}]})");
  EXPECT_EQ(c.token_ids, (std::vector<int32_t>{5, 6}));
  EXPECT_TRUE(c.finished);
  c = parse_stream_chunk(
      R"({"choices":[],"usage":{"prompt_tokens":32,"completion_tokens":16,"prompt_tokens_details":{"cached_tokens":16}}})");
  EXPECT_FALSE(c.has_choice);
  EXPECT_EQ(c.prompt_tokens, 32);
  EXPECT_EQ(c.completion_tokens, 16);
  EXPECT_EQ(c.cached_tokens, 16);
  c = parse_stream_chunk(R"({"choices":[{"text":"","finish_reason":"length"}],"timings":{"cache_n":12,"predicted_n":7}})");
  EXPECT_EQ(c.cached_tokens, 12);
  EXPECT_EQ(c.completion_tokens, 7);
  EXPECT_TRUE(parse_stream_chunk(" [DONE] ").done);
  c = parse_stream_chunk(R"({"error":{"message":"bad things","type":"x"}})");
  EXPECT_TRUE(c.error);
  EXPECT_EQ(c.error_message, "bad things");
  EXPECT_TRUE(parse_stream_chunk("{not json").error);
}

TEST(Http, UrlsAndMetrics) {
  auto u = parse_server_url("http://127.0.0.1:8080/v1/");
  ASSERT_TRUE(u.ok()) << u.message();
  EXPECT_EQ(u->host, "127.0.0.1");
  EXPECT_EQ(u->port, "8080");
  EXPECT_EQ(u->base_path, "");
  u = parse_server_url("http://example.com/proxy");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->port, "80");
  EXPECT_EQ(u->base_path, "/proxy");
  u = parse_server_url("http://[::1]:9000");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->host, "::1");
  EXPECT_EQ(u->port, "9000");
  EXPECT_FALSE(parse_server_url("https://x").ok());
  EXPECT_FALSE(parse_server_url("http://x:99999").ok());
  EXPECT_FALSE(parse_server_url("http://:80").ok());

  const std::string text =
      "# HELP pagoda:kv_cache_usage_perc KV-cache usage.\n"
      "# TYPE pagoda:kv_cache_usage_perc gauge\n"
      "pagoda:kv_cache_usage_perc 0.375\n"
      "vllm:num_preemptions_total{model_name=\"a}b\",x=\"1\"} 2\n"
      "vllm:num_preemptions_total{model_name=\"c\"} 3.0\n";
  EXPECT_DOUBLE_EQ(scrape_metric(text, {":kv_cache_usage_perc", ":gpu_cache_usage_perc"}), 0.375);
  EXPECT_DOUBLE_EQ(scrape_metric(text, {":num_preemptions_total"}), 5.0);
  EXPECT_DOUBLE_EQ(scrape_metric(text, {":missing"}), -1.0);
  EXPECT_EQ(first_model_id(R"({"object":"list","data":[{"id":"stories260K","object":"model"}]})"), "stories260K");
  EXPECT_EQ(first_model_id("[]"), "");
}

// ---- Real runs on stories260K ------------------------------------------------

std::unique_ptr<engine::Engine> make_engine() {
  engine::EngineConfig cfg;
  cfg.model_path = kStories;
  cfg.context_length = 512;
  cfg.threads = 1;
  auto e = engine::Engine::create(cfg);
  EXPECT_TRUE(e.ok()) << e.message();
  return e.ok() ? std::move(e).value() : nullptr;
}

TEST(Offline, RandomRunIsCompleteAndDeterministic) {
  uint64_t hashes[2] = {0, 0};
  for (int run = 0; run < 2; ++run) {
    auto eng = make_engine();
    ASSERT_TRUE(eng);
    auto reqs = make_random_workload(token_space(eng->tokenizer()), 8, 32, 16, 0.0, 0);
    RunOptions ro;
    ro.max_concurrency = run == 0 ? 0 : 3;  // concurrency must not change greedy outputs
    RunExtras ex;
    auto results = run_offline(*eng, reqs, ro, &ex);
    Summary s = summarize(results, ex);
    EXPECT_EQ(s.completed, 8);
    EXPECT_EQ(s.failed, 0) << s.first_error;
    EXPECT_EQ(s.total_input_tokens, 8 * 32);
    EXPECT_EQ(s.total_output_tokens, 128);
    EXPECT_TRUE(s.output_hash_known);
    EXPECT_GT(s.peak_kv_usage, 0.0);
    EXPECT_EQ(s.num_preemptions, 0);
    EXPECT_GT(s.duration_s, 0.0);
    for (const auto& r : results) {
      EXPECT_EQ(r.output_ids.size(), 16u);
      EXPECT_EQ(r.itl.size(), 15u);
    }
    // After the first step(s) every request decodes together.
    EXPECT_GT(s.steady_decode_tokens_per_s, 0.0);
    hashes[run] = s.output_hash;
  }
  EXPECT_EQ(hashes[0], hashes[1]);
}

TEST(Offline, SharedPrefixHitsTheCache) {
  auto eng = make_engine();
  ASSERT_TRUE(eng);
  // 2 groups x 4 prompts of 64 + 16 tokens, one at a time: every request after the
  // first of its group finds the 4 full prefix blocks (block size 16) cached.
  auto reqs = make_shared_prefix_workload(token_space(eng->tokenizer()), 2, 4, 64, 16, 4, 1);
  RunOptions ro;
  ro.max_concurrency = 1;
  RunExtras ex;
  Summary s = summarize(run_offline(*eng, reqs, ro, &ex), ex);
  EXPECT_EQ(s.completed, 8);
  EXPECT_EQ(s.total_input_tokens, 8 * 80);
  EXPECT_DOUBLE_EQ(s.prefix_hit_rate, 6.0 * 64 / (8 * 80));
}

TEST(Offline, TooLongRequestFailsWithoutStoppingTheRun) {
  auto eng = make_engine();
  ASSERT_TRUE(eng);
  auto reqs = make_random_workload(token_space(eng->tokenizer()), 3, 16, 4, 0.0, 2);
  reqs[1].max_tokens = 1000;  // 16 + 1000 > context 512
  RunExtras ex;
  Summary s = summarize(run_offline(*eng, reqs, RunOptions{}, &ex), ex);
  EXPECT_EQ(s.completed, 2);
  EXPECT_EQ(s.failed, 1);
  EXPECT_FALSE(s.first_error.empty());
}

// The benchmark client against a real in-process server: the same tokens as the
// offline run over keep-alive streams. It used to find two races in http.cc (a stale
// readiness wakeup taken for a disconnect; a throwing cancel() on a closed socket);
// the disconnect watcher now peeks with a per-response generation and cancel() takes
// an error_code, so it runs enabled.
TEST(Server, SameOutputAsOfflineAndFailuresCounted) {
  auto reqs = [] {
    auto eng = make_engine();
    return make_random_workload(token_space(eng->tokenizer()), 8, 32, 16, 0.0, 0);
  }();
  Summary offline;
  {
    auto eng = make_engine();
    ASSERT_TRUE(eng);
    RunExtras ex;
    offline = summarize(run_offline(*eng, reqs, RunOptions{}, &ex), ex);
  }
  server::ServerConfig cfg;
  cfg.http.port = 0;
  auto srv = server::Server::create(cfg, make_engine());
  ASSERT_TRUE(srv.ok()) << srv.message();
  auto port = (*srv)->start();
  ASSERT_TRUE(port.ok()) << port.message();
  std::thread th([&] { (*srv)->run(); });

  auto url = parse_server_url("http://127.0.0.1:" + std::to_string(*port));
  ASSERT_TRUE(url.ok());
  ServerRunOptions so;
  so.run.max_concurrency = 4;
  so.request_timeout_s = 60;
  RunExtras ex;
  auto results = run_server(*url, reqs, &so, &ex);
  Summary s = summarize(results, ex);
  EXPECT_EQ(so.model_name, "stories260K");
  EXPECT_EQ(s.completed, 8) << s.first_error;
  EXPECT_EQ(s.total_output_tokens, 128);
  EXPECT_EQ(s.total_input_tokens, 8 * 32);
  EXPECT_EQ(s.output_text_hash, offline.output_text_hash);
  if (s.output_hash_known) {
    EXPECT_EQ(s.output_hash, offline.output_hash);
  }
  EXPECT_GE(s.prefix_hit_rate, 0.0);  // from usage.prompt_tokens_details
  EXPECT_GE(s.peak_kv_usage, 0.0);    // /metrics answered
  EXPECT_EQ(s.num_preemptions, 0);
  for (const auto& r : results) EXPECT_EQ(r.itl.size() + 1, static_cast<size_t>(r.output_tokens));

  // A request the server rejects is a failed request with the server's message.
  std::vector<BenchRequest> bad = {reqs[0]};
  bad[0].max_tokens = 1000;
  Summary f = summarize(run_server(*url, bad, &so, &ex), ex);
  EXPECT_EQ(f.failed, 1);
  EXPECT_NE(f.first_error.find("HTTP 400"), std::string::npos) << f.first_error;

  (*srv)->stop();
  th.join();
}

TEST(Server, UnreachableServerGivesFailedRequests) {
  auto url = parse_server_url("http://127.0.0.1:1");
  ASSERT_TRUE(url.ok());
  std::vector<BenchRequest> reqs(3, BenchRequest{{1, 5, 6}, 4, ""});
  ServerRunOptions so;
  so.request_timeout_s = 5;
  RunExtras ex;
  Summary s = summarize(run_server(*url, reqs, &so, &ex), ex);
  EXPECT_EQ(s.completed, 0);
  EXPECT_EQ(s.failed, 3);
  EXPECT_NE(s.first_error.find("connect"), std::string::npos) << s.first_error;
  EXPECT_EQ(s.peak_kv_usage, -1);
}

}  // namespace
}  // namespace pagoda::cli::bench
