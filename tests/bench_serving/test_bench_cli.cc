// The benchmark's command lines as other tools spell them: llama-bench's flags and
// output formats (cli/bench_llama.h), vLLM `bench serve`'s flags, ShareGPT files and
// its --save-result JSON (cli/bench_serving_cli.h, loadgen/). Parsing and formatting only: the runs
// are in test_bench_serving.cc and test_bench_cli.py.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <tuple>
#include <utility>

#include "cli/bench_llama.h"
#include "cli/bench_serving_cli.h"
#include "loadgen/http_client.h"
#include "loadgen/report.h"
#include "loadgen/workload.h"
#include "gguf/gguf.h"
#include "tok/tokenizer.h"

namespace pagoda::cli {
namespace bench {
using namespace ::pagoda::loadgen;  // the benchmark moved to src/loadgen/ (issue 34)
}
namespace {

std::vector<char*> argv_of(std::vector<std::string>& words) {
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  return argv;
}

// ---- llama-bench -------------------------------------------------------------

std::string parse_llb(std::vector<std::string> words, llb::Options* o) {
  words.insert(words.begin(), "bench");
  std::vector<char*> argv = argv_of(words);
  bool help = false;
  return llb::parse_options(static_cast<int>(argv.size()), argv.data(), "default.gguf", 7, o, &help);
}

TEST(LlamaBenchFlags, IntRangesAsLlamaBench) {
  std::vector<int64_t> v;
  EXPECT_EQ(llb::parse_int_range("128,512", &v), "");
  EXPECT_EQ(llb::parse_int_range("1-4", &v), "");
  EXPECT_EQ(llb::parse_int_range("64-512*2", &v), "");
  EXPECT_EQ(llb::parse_int_range("0-10+5", &v), "");
  EXPECT_EQ(v, (std::vector<int64_t>{128, 512, 1, 2, 3, 4, 64, 128, 256, 512, 0, 5, 10}));
  for (const char* bad : {"", "a", "1,", "4-1", "1-", "1-4*1", "1-4+0", "1-4/2", "-3", "1.5"}) {
    std::vector<int64_t> w = {9};
    EXPECT_NE(llb::parse_int_range(bad, &w), "") << bad;
    EXPECT_EQ(w, std::vector<int64_t>{9}) << bad;  // a bad list adds nothing
  }
}

TEST(LlamaBenchFlags, DefaultsAreLlamaBenchs) {
  llb::Options o;
  ASSERT_EQ(parse_llb({}, &o), "");
  EXPECT_EQ(o.models, std::vector<std::string>{"default.gguf"});
  EXPECT_EQ(o.n_prompt, std::vector<int64_t>{512});
  EXPECT_EQ(o.n_gen, std::vector<int64_t>{128});
  EXPECT_EQ(o.n_threads, std::vector<int64_t>{7});
  EXPECT_EQ(o.n_batch, std::vector<int64_t>{2048});
  EXPECT_EQ(o.n_ubatch, std::vector<int64_t>{512});
  EXPECT_EQ(o.reps, 5);
  EXPECT_EQ(o.format, llb::Format::kMarkdown);
  EXPECT_FALSE(o.legacy_json);
}

TEST(LlamaBenchFlags, EachFlagFamily) {
  llb::Options o;
  ASSERT_EQ(parse_llb({"-m", "a.gguf,b.gguf", "-p", "128,512", "-n", "0,128", "-pg", "16,4", "-r", "3", "-t", "1-2",
                       "-b", "256", "-ub", "64", "-o", "jsonl", "--n_gen", "32", "-ngl", "99", "-ctk", "q8_0",
                       "-ctv", "q8_0", "--no-bandwidth", "--progress", "--seed", "9"},
                      &o),
            "");
  EXPECT_EQ(o.models, (std::vector<std::string>{"a.gguf", "b.gguf"}));
  EXPECT_EQ(o.n_prompt, (std::vector<int64_t>{128, 512}));
  EXPECT_EQ(o.n_gen, (std::vector<int64_t>{0, 128, 32}));  // repeated flags append, as llama-bench
  EXPECT_EQ(o.n_pg, (std::vector<std::pair<int64_t, int64_t>>{{16, 4}}));
  EXPECT_EQ(o.reps, 3);
  EXPECT_EQ(o.n_threads, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(o.n_batch, std::vector<int64_t>{256});
  EXPECT_EQ(o.n_ubatch, std::vector<int64_t>{64});
  EXPECT_EQ(o.format, llb::Format::kJsonl);
  EXPECT_EQ(o.kv_dtype, KvDtype::Q8_0);
  EXPECT_FALSE(o.bandwidth);
  EXPECT_TRUE(o.progress);
  EXPECT_EQ(o.seed, 9);
  ASSERT_EQ(o.warnings.size(), 1u);
  EXPECT_NE(o.warnings[0].find("-ngl 99"), std::string::npos);
  const std::vector<std::pair<std::string, llb::Format>> formats = {
      {"md", llb::Format::kMarkdown}, {"csv", llb::Format::kCsv}, {"json", llb::Format::kJson},
      {"jsonl", llb::Format::kJsonl}};
  for (const auto& [fmt, want] : formats) {
    llb::Options f;
    ASSERT_EQ(parse_llb({"-o", fmt}, &f), "");
    EXPECT_EQ(f.format, want);
  }
  // pagoda's earlier spellings still work.
  llb::Options old;
  ASSERT_EQ(parse_llb({"--pp", "0", "--tg", "64", "--reps", "2", "--json"}, &old), "");
  EXPECT_TRUE(old.legacy_json);
  const std::vector<llb::Instance> t = llb::instances(old);
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t[0].n_prompt, 0);
  EXPECT_EQ(t[0].n_gen, 64);
}

// llama-bench's get_cmd_params_instances: model, batch, ubatch, threads, depth outer to inner;
// per combination the pp tests, the tg tests, then the pp+tg pairs; zeros skipped.
TEST(LlamaBenchFlags, CrossProductInLlamaBenchOrder) {
  llb::Options o;
  ASSERT_EQ(parse_llb({"-m", "a,b", "-p", "128,0,512", "-n", "0,128", "-t", "1,2", "-pg", "16,4", "-pg", "0,0",
                       "-b", "64,32", "-d", "0,256"},
                      &o),
            "");
  std::vector<std::string> got;
  for (const llb::Instance& i : llb::instances(o))
    got.push_back(i.model + " b" + std::to_string(i.n_batch) + " t" + std::to_string(i.n_threads) + " " +
                  llb::test_name(i.n_prompt, i.n_gen, i.n_depth));
  std::vector<std::string> want;
  for (const char* m : {"a", "b"})
    for (const char* b : {"64", "32"})
      for (const char* t : {"1", "2"})
        for (const char* d : {"", " @ d256"})
          for (const char* test : {"pp128", "pp512", "tg128", "pp16+tg4"})
            want.push_back(std::string(m) + " b" + b + " t" + t + " " + test + d);
  EXPECT_EQ(got, want);
}

TEST(LlamaBenchFlags, BadValuesNameTheFlag) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"-p", "x"}, "-p"},
      {{"-n", "1-"}, "-n"},
      {{"-t", "0"}, "-t"},
      {{"-b", "0"}, "-b"},
      {{"-r", "0"}, "-r"},
      {{"-o", "sql"}, "-o"},
      {{"-pg", "5"}, "-pg"},
      {{"-pg", "5,x"}, "-pg"},
      {{"-d", "x"}, "-d"},
      {{"-d", "16", "--ctx-sweep"}, "--ctx-sweep"},
      {{"--frobnicate", "1"}, "--frobnicate"},
      {{"-m"}, "-m"},
      {{"--json", "-o", "csv"}, "--json"},
      {{"--json", "-p", "1,2"}, "--json"},
      {{"-p", "0", "-n", "0"}, "nothing to run"},
      {{"-ctk", "q9"}, "q9"},
  };
  for (const auto& [words, flag] : cases) {
    llb::Options o;
    const std::string err = parse_llb(words, &o);
    EXPECT_NE(err.find(flag), std::string::npos) << words[0] << ": " << err;
  }
}

// Two results with known samples: pp512 at 0.5 s and 0.25 s, tg128 at 1 s and 2 s.
std::vector<llb::Result> sample_results() {
  llb::Result pp;
  pp.inst = {"m.gguf", 512, 0, 2048, 512, 2};
  pp.model = {"m.gguf", "llama 135M Q4_1", 3ull << 20, 135000000};
  pp.type_k = "f16";
  pp.type_v = "f16";
  pp.test_time = "2026-01-02T03:04:05Z";
  pp.samples_ns = {500000000, 250000000};
  pp.weight_bytes_per_token = 1000000;
  llb::Result tg = pp;
  tg.inst.n_prompt = 0;
  tg.inst.n_gen = 128;
  tg.samples_ns = {1000000000, 2000000000};
  tg.read_gb_per_s = 0.5;
  tg.tokens_hash = "0x00000000000000ab";
  return {pp, tg};
}

TEST(LlamaBenchOutput, StatisticsAsLlamaBench) {
  const std::vector<llb::Result> r = sample_results();
  EXPECT_DOUBLE_EQ(r[0].avg_ts(), (1024.0 + 2048.0) / 2);
  EXPECT_NEAR(r[0].stddev_ts(), std::sqrt(2 * 512.0 * 512.0), 1e-9);  // sample (n - 1) deviation
  EXPECT_DOUBLE_EQ(r[1].avg_ts(), 96.0);
  EXPECT_DOUBLE_EQ(r[1].avg_ns(), 1.5e9);
  EXPECT_DOUBLE_EQ(r[1].weight_gb_per_s(), 96.0 * 1e6 / 1e9);
  EXPECT_DOUBLE_EQ(r[1].read_bw_fraction(), 0.096 / 0.5);
  EXPECT_DOUBLE_EQ(r[0].weight_gb_per_s(), 0.0);  // pp reads its weights once per pass
}

TEST(LlamaBenchOutput, JsonAndJsonlHaveLlamaBenchsFields) {
  llb::Options o;
  ASSERT_EQ(parse_llb({}, &o), "");
  const std::vector<llb::Result> r = sample_results();
  const auto check = [&](const nlohmann::json& j, size_t i) {
    for (const char* k : {"build_commit", "build_number", "cpu_info", "gpu_info", "backends", "model_filename",
                          "model_type", "model_size", "model_n_params", "n_batch", "n_ubatch", "n_threads", "type_k",
                          "type_v", "n_gpu_layers", "n_prompt", "n_gen", "n_depth", "test_time", "avg_ns",
                          "stddev_ns", "avg_ts", "stddev_ts", "samples_ns", "samples_ts", "read_bw_fraction"})
      EXPECT_TRUE(j.contains(k)) << k;
    EXPECT_EQ(j.size(), llb::fields().size() + 2);  // + samples_ns, samples_ts
    EXPECT_EQ(j["build_commit"], "abc1234");
    EXPECT_EQ(j["model_filename"], "m.gguf");
    EXPECT_EQ(j["model_type"], "llama 135M Q4_1");
    EXPECT_EQ(j["model_size"], 3ull << 20);
    EXPECT_EQ(j["model_n_params"], 135000000);
    EXPECT_EQ(j["n_threads"], 2);
    EXPECT_EQ(j["n_batch"], 2048);
    EXPECT_EQ(j["type_k"], "f16");
    EXPECT_EQ(j["cpu_strict"], false);
    EXPECT_EQ(j["n_prompt"], r[i].inst.n_prompt);
    EXPECT_EQ(j["n_gen"], r[i].inst.n_gen);
    EXPECT_EQ(j["test_time"], "2026-01-02T03:04:05Z");
    EXPECT_EQ(j["avg_ns"], i == 0 ? 375000000 : 1500000000);
    EXPECT_NEAR(j["avg_ts"].get<double>(), r[i].avg_ts(), 1e-5);
    EXPECT_NEAR(j["stddev_ts"].get<double>(), r[i].stddev_ts(), 1e-5);
    EXPECT_EQ(j["samples_ns"], nlohmann::json(r[i].samples_ns));
    ASSERT_EQ(j["samples_ts"].size(), 2u);
    EXPECT_NEAR(j["samples_ts"][0].get<double>(), r[i].samples_ts()[0], 1e-3);
    EXPECT_EQ(j["tokens_hash"], i == 0 ? "" : "0x00000000000000ab");
  };
  const nlohmann::json arr = nlohmann::json::parse(llb::format_results(r, o, llb::Format::kJson, "abc1234"));
  ASSERT_TRUE(arr.is_array());
  ASSERT_EQ(arr.size(), 2u);
  for (size_t i = 0; i < 2; ++i) check(arr[i], i);
  std::istringstream lines(llb::format_results(r, o, llb::Format::kJsonl, "abc1234"));
  std::string line;
  size_t n = 0;
  while (std::getline(lines, line)) check(nlohmann::json::parse(line), n++);
  EXPECT_EQ(n, 2u);
}

TEST(LlamaBenchOutput, CsvAndMarkdownColumns) {
  llb::Options o;
  ASSERT_EQ(parse_llb({}, &o), "");
  const std::vector<llb::Result> r = sample_results();
  std::istringstream csv(llb::format_results(r, o, llb::Format::kCsv, "abc1234"));
  std::string header, row;
  ASSERT_TRUE(std::getline(csv, header));
  std::string want;
  for (const std::string& f : llb::fields()) want += (want.empty() ? "" : ",") + f;
  EXPECT_EQ(header, want);
  EXPECT_EQ(header.rfind("build_commit,build_number,cpu_info,gpu_info,backends,model_filename,model_type,", 0), 0u);
  ASSERT_TRUE(std::getline(csv, row));
  EXPECT_EQ(row.rfind("\"abc1234\",\"0\",", 0), 0u);  // every value quoted, as llama-bench
  EXPECT_NE(row.find(",\"512\",\"0\",\"0\",\"2026-01-02T03:04:05Z\",\"375000000\","), std::string::npos) << row;

  const std::string md = llb::format_results(r, o, llb::Format::kMarkdown, "abc1234");
  std::istringstream mds(md);
  std::vector<std::string> rows;
  while (std::getline(mds, row)) rows.push_back(row);
  ASSERT_GE(rows.size(), 6u);
  // Widths and padding checked against llama-bench's own md output (the UTF-8 '±' counts one column).
  EXPECT_EQ(rows[0],
            "| model                          |       size |     params | backend    | threads |            test |"
            "                  t/s | % read bw |");
  EXPECT_EQ(rows[1].rfind("| ------------------------------ | ---------: | ---------: | ---------- | ------: |", 0), 0u);
  EXPECT_EQ(rows[2],
            "| llama 135M Q4_1                |   3.00 MiB |   135.00 M | CPU        |       2 |           pp512 |"
            "     1536.00 \xC2\xB1 724.08 |           |");
  EXPECT_NE(rows[3].find("|           tg128 |        96.00 \xC2\xB1 45.25 |      19 % |"), std::string::npos) << rows[3];
  EXPECT_EQ(rows[5], "build: abc1234 (0)");
}

// ---- vLLM bench serve --------------------------------------------------------

std::string parse_vllm(std::vector<std::string> words, bench::ServingConfig* c) {
  words.insert(words.begin(), "bench");
  std::vector<char*> argv = argv_of(words);
  bool help = false;
  return bench::parse_serving_args(static_cast<int>(argv.size()), argv.data(), c, &help);
}

TEST(VllmServeFlags, RandomDatasetAndServer) {
  bench::ServingConfig c;
  ASSERT_EQ(parse_vllm({"--dataset-name", "random", "--random-input-len", "100", "--random-output-len", "20",
                        "--random-range-ratio", "0.5", "--num-prompts", "7", "--request-rate", "4",
                        "--max-concurrency", "3", "--base-url", "http://10.0.0.1:8000", "--endpoint",
                        "/v1/chat/completions", "--model", "served-name", "--save-result", "--result-dir", "out",
                        "--result-filename", "r.json", "--percentile-metrics", "ttft,e2el", "--metric-percentiles",
                        "50,90,99.9", "--seed", "3", "--disable-tqdm", "--label", "L"},
                       &c),
            "");
  EXPECT_EQ(c.workload, "random");
  EXPECT_TRUE(c.vllm_dataset);
  // (input, output, prompts, concurrency) and (range ratio, rate): exact values of the flags above
  EXPECT_EQ(std::make_tuple(c.input_len, c.output_len, c.num_prompts, c.max_concurrency), std::make_tuple(100, 20, 7, 3));
  EXPECT_EQ(std::make_pair(c.range_ratio, c.request_rate), std::make_pair(0.5, 4.0));
  EXPECT_EQ(c.server_url, "http://10.0.0.1:8000");
  EXPECT_EQ(c.endpoint, "/v1/chat/completions");
  EXPECT_EQ(c.model_name, "served-name");  // not a file: the served model's name
  EXPECT_TRUE(c.save_result);
  EXPECT_EQ(c.result_dir, "out");
  EXPECT_EQ(c.result_filename, "r.json");
  EXPECT_EQ(c.selection.metrics, (std::vector<std::string>{"ttft", "e2el"}));
  EXPECT_EQ(c.selection.percentiles, (std::vector<double>{50, 90, 99.9}));
  EXPECT_EQ(c.seed, 3);
  EXPECT_FALSE(c.progress);
  EXPECT_EQ(c.label, "L");
  EXPECT_TRUE(c.ignore_eos);  // vLLM ignores EOS for random prompts

  bench::ServingConfig d;  // vLLM's defaults
  ASSERT_EQ(parse_vllm({"--dataset-name", "random", "--host", "127.0.0.1", "--port", "9001", "--backend",
                        "openai-chat", "-m", PAGODA_TEST_DATA "/stories260K.gguf"},
                       &d),
            "");
  EXPECT_EQ(d.num_prompts, 1000);
  EXPECT_EQ(d.input_len, 1024);
  EXPECT_EQ(d.output_len, 128);
  EXPECT_EQ(d.server_url, "http://127.0.0.1:9001");
  EXPECT_EQ(d.endpoint, "/v1/chat/completions");
  EXPECT_EQ(d.engine.model_path, PAGODA_TEST_DATA "/stories260K.gguf");
  EXPECT_EQ(d.model_name, "");
  EXPECT_EQ(d.selection.metrics, (std::vector<std::string>{"ttft", "tpot", "itl", "e2el"}));
  EXPECT_EQ(d.selection.percentiles, std::vector<double>{99});
}

TEST(VllmServeFlags, PrefixRepetitionAndShareGpt) {
  bench::ServingConfig c;
  ASSERT_EQ(parse_vllm({"--dataset-name", "prefix_repetition"}, &c), "");
  EXPECT_EQ(c.workload, "shared-prefix");
  EXPECT_EQ(c.prefix_len, 256);
  EXPECT_EQ(c.suffix_len, 256);
  EXPECT_EQ(c.num_groups, 10);
  EXPECT_EQ(c.prompts_per_group, 100);  // 1000 prompts over 10 prefixes
  EXPECT_EQ(c.output_len, 128);
  EXPECT_FALSE(c.ignore_eos);
  bench::ServingConfig d;
  ASSERT_EQ(parse_vllm({"--dataset-name", "prefix_repetition", "--num-prompts", "9", "--prefix-repetition-prefix-len",
                        "64", "--prefix-repetition-suffix-len", "8", "--prefix-repetition-num-prefixes", "2",
                        "--prefix-repetition-output-len", "4"},
                       &d),
            "");
  EXPECT_EQ(d.prefix_len, 64);
  EXPECT_EQ(d.suffix_len, 8);
  EXPECT_EQ(d.num_groups, 2);
  EXPECT_EQ(d.prompts_per_group, 4);
  EXPECT_EQ(d.output_len, 4);
  bench::ServingConfig s;
  ASSERT_EQ(parse_vllm({"--dataset-name", "sharegpt", "--dataset-path", "x.json", "--sharegpt-output-len", "12",
                        "--disable-shuffle", "--ignore-eos"},
                       &s),
            "");
  EXPECT_EQ(s.workload, "sharegpt");
  EXPECT_EQ(s.dataset_path, "x.json");
  EXPECT_EQ(s.sharegpt_output_len, 12);
  EXPECT_FALSE(s.shuffle);
  EXPECT_TRUE(s.ignore_eos);
  bench::ServingConfig p;  // pagoda's own spellings are unchanged
  ASSERT_EQ(parse_vllm({"--workload", "shared-prefix", "--num-groups", "3", "--prompts-per-group", "5"}, &p), "");
  EXPECT_EQ(p.workload, "shared-prefix");
  EXPECT_EQ(p.num_groups, 3);
  EXPECT_EQ(p.prompts_per_group, 5);
  EXPECT_EQ(p.prefix_len, 256);
  EXPECT_EQ(p.suffix_len, 32);
  EXPECT_TRUE(p.ignore_eos);
}

TEST(VllmServeFlags, BadValuesNameTheFlag) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--dataset-name", "sonnet"}, "--dataset-name"},
      {{"--dataset-name", "sharegpt"}, "--dataset-path"},
      {{"--dataset-name", "random", "--dataset-path", "x.json"}, "--dataset-path"},
      {{"--dataset-name", "prefix_repetition", "--num-prompts", "5"}, "--prefix-repetition-num-prefixes"},
      {{"--dataset-name", "random", "--endpoint", "/v1/embeddings"}, "--endpoint"},
      {{"--dataset-name", "random", "--backend", "tgi"}, "--backend"},
      {{"--dataset-name", "random", "--percentile-metrics", "ttft,goodput"}, "--percentile-metrics"},
      {{"--dataset-name", "random", "--metric-percentiles", "50,101"}, "--metric-percentiles"},
      {{"--dataset-name", "random", "--random-input-len", "0"}, "--random-input-len"},
      {{"--dataset-name", "random", "--random-range-ratio", "2"}, "--random-range-ratio"},
      {{"--dataset-name", "random", "--request-rate", "fast"}, "--request-rate"},
      {{"--dataset-name", "random", "--num-prompts", "-1"}, "--num-prompts"},
      {{"--dataset-name", "random", "--result-dir", "d"}, "--save-result"},
      {{"--dataset-name", "random", "--bogus"}, "--bogus"},
      {{}, "--dataset-name"},
  };
  for (const auto& [words, flag] : cases) {
    bench::ServingConfig c;
    const std::string err = parse_vllm(words, &c);
    EXPECT_NE(err.find(flag), std::string::npos) << (words.empty() ? "" : words.back()) << ": " << err;
  }
}

TEST(ShareGpt, FileReadIntoTheExpectedPrompts) {
  auto f = gguf::GgufFile::open(PAGODA_TEST_DATA "/stories260K.gguf");
  ASSERT_TRUE(f.ok());
  auto tk = tok::Tokenizer::from_gguf(**f);
  ASSERT_TRUE(tk.ok());
  const std::string path = PAGODA_TEST_DATA "/sharegpt_sample.json";
  // In file order: entry 1 has one turn; entry 2's reply ("Ok.") is under 4 tokens.
  auto r = bench::load_sharegpt(path, **tk, 0, 0, 0, /*shuffle=*/false);
  ASSERT_TRUE(r.ok()) << r.message();
  const std::vector<std::pair<std::string, std::string>> want = {
      {"Once upon a time there was a little girl named Lily. What did she like to do?",
       "Lily liked to play in the park with her big red ball every sunny day."},
      {"The sun was warm and the birds were singing. What did Tom see?",
       "Tom saw a small dog running after a butterfly near the old tree."},
      {"Sara wanted to bake a cake for her mom. What did she need?",
       "She needed flour, eggs, milk and a lot of love to make it sweet."},
      {"You are a storyteller.", "Write one sentence about a brave little bird."},
  };
  ASSERT_EQ(r->size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ((*r)[i].text, want[i].first);
    EXPECT_EQ((*r)[i].prompt, (*tk)->encode(want[i].first, true, false));
    EXPECT_EQ((*r)[i].prompt[0], (*tk)->bos_id());
    EXPECT_EQ((*r)[i].max_tokens, static_cast<int32_t>((*tk)->encode(want[i].second, false, false).size()));
  }
  // A fixed output length keeps the short reply; the seeded shuffle is a permutation.
  auto fixed = bench::load_sharegpt(path, **tk, 0, 16, 5, /*shuffle=*/true);
  ASSERT_TRUE(fixed.ok());
  ASSERT_EQ(fixed->size(), 5u);
  std::multiset<std::string> texts;
  for (const auto& q : *fixed) {
    EXPECT_EQ(q.max_tokens, 16);
    texts.insert(q.text);
  }
  EXPECT_EQ(texts.count("Tim had a toy boat. Where did he sail it?"), 1u);
  auto again = bench::load_sharegpt(path, **tk, 0, 16, 5, true);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ((*again)[i].text, (*fixed)[i].text);
  // More prompts than usable entries: vLLM's oversampling repeats them.
  auto many = bench::load_sharegpt(path, **tk, 10, 0, 1, true);
  ASSERT_TRUE(many.ok());
  EXPECT_EQ(many->size(), 10u);
  // Not a ShareGPT file: an error naming the flag.
  auto bad = bench::load_sharegpt(PAGODA_TEST_DATA "/stories260K.reference.jsonl", **tk, 0, 0, 0, false);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("--dataset-path"), std::string::npos);
}

// The --save-result JSON from known per-request results: vLLM's keys and numbers.
TEST(VllmResult, KeysAndValues) {
  std::vector<bench::RequestResult> rs(3);
  for (size_t i = 0; i < 2; ++i) {
    bench::RequestResult& r = rs[i];
    r.ok = true;
    r.start = 0.1 * static_cast<double>(i);
    r.ttft = 0.010 * static_cast<double>(i + 1);      // 10, 20 ms
    r.itl = {0.5, 0.6};                               // tokens at ttft, +0.5, +1.1 s
    r.e2e = r.ttft + 1.1;
    r.prompt_tokens = 10;
    r.output_tokens = 3;
    r.text = "abc";
  }
  rs[2].error = "HTTP 400: too long";
  rs[2].prompt_tokens = 10;
  bench::RunExtras ex;
  ex.duration = 2.0;
  bench::Summary s = bench::summarize(rs, ex);
  s.max_concurrency = 4;
  s.request_rate = 8;
  bench::MetricSelection sel;
  sel.metrics = {"ttft", "itl"};
  sel.percentiles = {50, 90};
  bench::ResultMeta meta;
  meta.date = "20260102-030405";
  meta.model_id = "stories260K";
  meta.tokenizer_id = "t.gguf";
  meta.num_prompts = 3;
  nlohmann::json j = nlohmann::json::parse(bench::format_vllm_result(s, sel, meta, rs));
  EXPECT_EQ(j["date"], "20260102-030405");
  EXPECT_EQ(j["backend"], "openai");
  EXPECT_EQ(j["model_id"], "stories260K");
  EXPECT_EQ(j["num_prompts"], 3);
  EXPECT_EQ(j["request_rate"], 8.0);
  EXPECT_EQ(j["max_concurrency"], 4);
  EXPECT_EQ(j["completed"], 2);
  EXPECT_EQ(j["failed"], 1);
  EXPECT_EQ(j["total_input_tokens"], 20);
  EXPECT_EQ(j["total_output_tokens"], 6);
  EXPECT_DOUBLE_EQ(j["duration"].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(j["request_throughput"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(j["output_throughput"].get<double>(), 3.0);
  EXPECT_DOUBLE_EQ(j["total_token_throughput"].get<double>(), 13.0);
  EXPECT_NEAR(j["mean_ttft_ms"].get<double>(), 15.0, 1e-9);
  EXPECT_NEAR(j["median_ttft_ms"].get<double>(), 15.0, 1e-9);
  EXPECT_NEAR(j["std_ttft_ms"].get<double>(), 5.0, 1e-9);  // numpy's std: population
  EXPECT_NEAR(j["p50_ttft_ms"].get<double>(), 15.0, 1e-9);
  EXPECT_NEAR(j["p90_ttft_ms"].get<double>(), 19.0, 1e-9);
  EXPECT_NEAR(j["mean_itl_ms"].get<double>(), 550.0, 1e-9);
  EXPECT_NEAR(j["p90_itl_ms"].get<double>(), 600.0, 1e-9);
  EXPECT_FALSE(j.contains("mean_tpot_ms"));  // not selected
  EXPECT_FALSE(j.contains("p99_ttft_ms"));
  EXPECT_FALSE(j.contains("ttfts"));        // only with --save-detailed
  // Token arrivals: request 0 at 0.01, 0.51, 1.11 s; request 1 at 0.12, 0.62, 1.22 s.
  EXPECT_DOUBLE_EQ(j["max_output_tokens_per_s"].get<double>(), 4.0);
  EXPECT_EQ(j["max_concurrent_requests"], 2);
  EXPECT_TRUE(j["request_goodput"].is_null());
  EXPECT_TRUE(j["label"].is_null());

  meta.detailed = true;
  j = nlohmann::json::parse(bench::format_vllm_result(s, sel, meta, rs));
  EXPECT_EQ(j["input_lens"], nlohmann::json({10, 10, 10}));
  EXPECT_EQ(j["output_lens"], nlohmann::json({3, 3, 0}));
  EXPECT_EQ(j["errors"], nlohmann::json({"", "", "HTTP 400: too long"}));
  EXPECT_EQ(j["generated_texts"][0], "abc");

  EXPECT_EQ(bench::default_result_filename("openai", std::numeric_limits<double>::infinity(), 0, "org/stories",
                                           "20260102-030405"),
            "openai-infqps-stories-20260102-030405.json");
  EXPECT_EQ(bench::default_result_filename("L", 4, 8, "m", "D"), "L-4.0qps-concurrency8-m-D.json");
  EXPECT_EQ(bench::default_result_filename("L", 0.5, 0, "m", "D"), "L-0.5qps-m-D.json");
  EXPECT_EQ(bench::percentile_word(99.9), "p99.9");
}

TEST(VllmResult, ReportFollowsTheSelection) {
  bench::Summary s;
  s.ttfts = {0.01, 0.03};
  s.e2els = {1.0};
  bench::MetricSelection sel;
  sel.metrics = {"e2el", "ttft"};
  sel.percentiles = {25, 75};
  const std::string o = bench::format_report(s, sel);
  const size_t e2el = o.find("End-to-end Latency"), ttft = o.find("Time to First Token");
  ASSERT_NE(e2el, std::string::npos);
  ASSERT_NE(ttft, std::string::npos);
  EXPECT_LT(e2el, ttft);
  EXPECT_EQ(o.find("Inter-token Latency"), std::string::npos);
  auto line = [](std::string label, const char* value) {  // vLLM's "{:<40} {:<10.2f}"
    label.resize(40, ' ');
    return label + " " + value + "\n";
  };
  EXPECT_NE(o.find(line("P25 TTFT (ms):", "15.00")), std::string::npos) << o;
  EXPECT_NE(o.find(line("P75 TTFT (ms):", "25.00")), std::string::npos) << o;
}

TEST(ChatEndpoint, BodyAndChunks) {
  bench::BenchRequest r{{1, 2, 3}, 5, "Hello there"};
  const nlohmann::json chat = nlohmann::json::parse(bench::completion_body(r, "m", true, /*chat=*/true));
  EXPECT_EQ(chat["messages"], nlohmann::json::parse(R"([{"role":"user","content":"Hello there"}])"));
  EXPECT_EQ(chat["max_completion_tokens"], 5);
  EXPECT_FALSE(chat.contains("prompt"));
  EXPECT_EQ(chat["model"], "m");
  EXPECT_EQ(chat["stream"], true);
  const nlohmann::json comp = nlohmann::json::parse(bench::completion_body(r, "", false));
  EXPECT_EQ(comp["prompt"], nlohmann::json({1, 2, 3}));
  EXPECT_EQ(comp["max_tokens"], 5);
  EXPECT_FALSE(comp.contains("model"));
  const bench::StreamChunk c = bench::parse_stream_chunk(
      R"({"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":" Lily"},"token_ids":[7],"finish_reason":null}]})");
  EXPECT_TRUE(c.has_choice);
  EXPECT_EQ(c.text, " Lily");
  EXPECT_EQ(c.token_ids, std::vector<int32_t>{7});
}

}  // namespace
}  // namespace pagoda::cli
