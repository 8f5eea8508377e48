// pagoda bench serving mode: the command line (pagoda's flags and vLLM `bench serve`'s),
// building the workload, the run, the report and vLLM's --save-result file.
#include <unistd.h>

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>

#include <nlohmann/json.hpp>

#include "base/timer.h"
#include "cli/bench_serving_cli.h"
#include "cli/cli_util.h"
#include "cli/command.h"
#include "cli/engine_flags.h"
#include "cli/run_report.h"
#include "engine/engine.h"
#include "gguf/gguf.h"
#include "loadgen/copy_workload.h"
#include "loadgen/http_client.h"
#include "loadgen/report.h"
#include "loadgen/serving.h"
#include "loadgen/workload.h"
#include "tok/tokenizer.h"

namespace pagoda::cli {

namespace {

const char* kServingHelp =
    "usage: pagoda bench (--dataset-name NAME | --workload W | --dataset FILE.jsonl) [--base-url URL] [options]\n"
    "Serving benchmark: the workload runs offline through one in-process engine, or against an\n"
    "OpenAI-compatible server with --base-url/--server (streamed; completions get token-id prompts).\n"
    "\n"
    "vLLM `bench serve` flags (vLLM's defaults apply when --dataset-name is given):\n"
    "  --dataset-name random|sharegpt|prefix_repetition\n"
    "    random: --random-input-len L (1024) --random-output-len O (128) --random-range-ratio R (0)\n"
    "    sharegpt: --dataset-path FILE.json (a list of {\"conversations\": [{\"from\", \"value\"}, ...]}),\n"
    "              --sharegpt-output-len O (default: the reply's token count), --disable-shuffle\n"
    "    prefix_repetition: --prefix-repetition-prefix-len P (256) --prefix-repetition-suffix-len Q (256)\n"
    "              --prefix-repetition-num-prefixes G (10) --prefix-repetition-output-len O (128)\n"
    "  --num-prompts N               requests (default 1000; prefix_repetition: N / G per prefix)\n"
    "  --input-len L, --output-len O vLLM's general lengths (map to the dataset's own)\n"
    "  --base-url URL | --host H --port P   the server (without them the run is offline)\n"
    "  --endpoint PATH               /v1/completions (default) or /v1/chat/completions\n"
    "  --backend B                   openai | vllm (completions) or openai-chat (chat endpoint)\n"
    "  --model NAME                  the request's model (when not a GGUF path); --served-model-name too\n"
    "  --tokenizer FILE.gguf         the local tokenizer in server mode (default: -m or the default model)\n"
    "  --save-result                 write vLLM's result JSON; --result-dir D, --result-filename F,\n"
    "                                --label L, --save-detailed (per-request lists); --append-result\n"
    "                                adds one line to the file instead\n"
    "  --percentile-metrics LIST     of ttft,tpot,itl,e2el (default: all four)\n"
    "  --metric-percentiles LIST     e.g. 50,90,99 (default 99)\n"
    "  --disable-tqdm                no progress line (shown only when stdout is a terminal)\n"
    "pagoda's workloads (pagoda's defaults: 64 prompts of 128 -> 128 tokens):\n"
    "  --workload random             random ordinary token ids (BOS first when the model adds one)\n"
    "    --input-len L --output-len O --range-ratio R\n"
    "  --workload shared-prefix      G prefixes x R distinct suffixes, shuffled\n"
    "    --num-groups G --prompts-per-group R   (default 4 x 8)\n"
    "    --prefix-len P --suffix-len Q --output-len O   (default 256 / 32 / 128)\n"
    "  --workload copy               \"repeat this code with one change\" chat prompts (loadgen/copy_workload.h;\n"
    "                                --num-prompts, --output-len; ends at end of generation)\n"
    "  --workload copy-long          the same over a 16-entry dict (answers of about 110 tokens)\n"
    "  --dataset FILE.jsonl          lines of {\"prompt\": str, \"max_tokens\": int} (first --num-prompts lines)\n"
    "common:\n"
    "  --max-concurrency C           at most C requests in flight (default: unlimited; server mode: 256)\n"
    "  --request-rate R              Poisson arrivals at R req/s (default inf: all at once)\n"
    "  --seed S                      seed of prompts and arrivals (default 0)\n"
    "  --ignore-eos / --no-ignore-eos  generate exactly max_tokens (default on for random workloads)\n"
    "  --json                        print one JSON object instead of the text block\n"
    "  --report FILE.html            write the run's time series (KV usage, hit rate, running/waiting,\n"
    "                                preemptions, tokens/s) as a self-contained HTML report\n"
    "  --save-prompts FILE.jsonl     write the workload's requests as --dataset lines ({\"prompt\": text,\n"
    "                                \"max_tokens\": O}; copy: the chat message) and exit without a run\n"
    "server mode:\n"
    "  --server URL                  e.g. http://127.0.0.1:8080 (the same as --base-url)\n"
    "  --model-name NAME             \"model\" field (default: first id of GET /v1/models)\n"
    "  --api-key KEY                 sent as 'Authorization: Bearer KEY'\n"
    "  --request-timeout S           per-request limit in seconds (default 600)\n"
    "engine (offline mode; -m also gives the tokenizer in server mode):\n";

std::string double_opt(Args& args, const char* name, double lo, double hi, double* out) {
  std::string v;
  if (!args.value(name, &v)) return "";
  if (v == "inf") {
    *out = std::numeric_limits<double>::infinity();
  } else {
    double d = 0;
    if (!parse_f64(v, &d) || !(d >= lo && d <= hi)) return std::string(name) + " must be a number, got '" + v + "'";
    *out = d;
  }
  return "";
}

bool has_arg(int argc, char** argv, const std::string& name) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == name || a.rfind(name + "=", 0) == 0) return true;
  }
  return false;
}

}  // namespace

namespace bench {

std::string parse_percentile_metrics(const std::string& s, std::vector<std::string>* out) {
  std::vector<std::string> names;
  size_t b = 0;
  for (;;) {
    const size_t e = s.find(',', b);
    const std::string n = s.substr(b, e == std::string::npos ? std::string::npos : e - b);
    if (n != "ttft" && n != "tpot" && n != "itl" && n != "e2el")
      return "--percentile-metrics: '" + n + "' is not one of ttft, tpot, itl, e2el";
    if (std::find(names.begin(), names.end(), n) != names.end()) return "--percentile-metrics: '" + n + "' twice";
    names.push_back(n);
    if (e == std::string::npos) break;
    b = e + 1;
  }
  *out = std::move(names);
  return "";
}

std::string parse_metric_percentiles(const std::string& s, std::vector<double>* out) {
  std::vector<double> ps;
  size_t b = 0;
  for (;;) {
    const size_t e = s.find(',', b);
    const std::string v = s.substr(b, e == std::string::npos ? std::string::npos : e - b);
    double p = 0;
    if (!parse_f64(v, &p) || !(p >= 0 && p <= 100))
      return "--metric-percentiles: '" + v + "' is not a percentile in 0..100";
    ps.push_back(p);
    if (e == std::string::npos) break;
    b = e + 1;
  }
  *out = std::move(ps);
  return "";
}


std::string parse_serving_args(int argc, char** argv, ServingConfig* c, bool* help) {
  // vLLM's --model names the served model; pagoda's --model is a GGUF path. A value
  // that is no file, with a server, is the former: it leaves argv for the model name.
  std::vector<char*> av(argv, argv + argc);
  const bool server = has_arg(argc, argv, "--server") || has_arg(argc, argv, "--base-url") ||
                      has_arg(argc, argv, "--host") || has_arg(argc, argv, "--port");
  for (size_t i = 1; server && i < av.size(); ++i) {
    const std::string a = av[i];
    std::string v;
    size_t take = 0;
    if (a == "--model" && i + 1 < av.size()) v = av[i + 1], take = 2;
    else if (a.rfind("--model=", 0) == 0) v = a.substr(8), take = 1;
    if (take == 0 || std::filesystem::exists(v)) continue;
    c->model_name = v;
    av.erase(av.begin() + static_cast<std::ptrdiff_t>(i), av.begin() + static_cast<std::ptrdiff_t>(i + take));
    --i;
  }
  Args args(static_cast<int>(av.size()), av.data());
  if (args.help()) {
    *help = true;
    return "";
  }
  std::string err = parse_engine_flags(args, &c->engine);
  auto keep = [&err](std::string e) {
    if (err.empty()) err = std::move(e);
  };
  std::string dataset_name, jsonl, tokenizer, v;
  args.value("--dataset-name", &dataset_name);
  args.value("--dataset-path", &c->dataset_path);
  args.value("--workload", &c->workload);
  args.value("--dataset", &jsonl);
  args.value("--server", &c->server_url);
  args.value("--base-url", &c->server_url);
  if (has_arg(argc, argv, "--host") || has_arg(argc, argv, "--port")) {
    // vLLM's defaults; read from argv only (PAGODA_HOST/PORT are serve's).
    std::string host = "127.0.0.1", port = "8000";
    args.value("--host", &host);
    args.value("--port", &port);
    if (c->server_url.empty()) c->server_url = "http://" + host + ":" + port;
  }
  const bool endpoint_given = args.value("--endpoint", &c->endpoint);
  if (args.value("--backend", &c->backend)) {
    if (c->backend == "openai-chat") {
      if (!endpoint_given) c->endpoint = "/v1/chat/completions";
    } else if (c->backend != "openai" && c->backend != "vllm") {
      keep("--backend must be openai, vllm or openai-chat, got '" + c->backend + "'");
    }
  }
  if (c->endpoint != "/v1/completions" && c->endpoint != "/v1/chat/completions")
    keep("--endpoint must be /v1/completions or /v1/chat/completions, got '" + c->endpoint + "'");
  args.value("--model-name", &c->model_name);
  args.value("--served-model-name", &c->model_name);
  args.value("--api-key", &c->api_key);
  args.value("--label", &c->label);
  if (args.value("--tokenizer", &tokenizer)) c->engine.model_path = tokenizer;

  // vLLM's defaults first, so that explicit flags override them.
  c->vllm_dataset = !dataset_name.empty();
  if (c->vllm_dataset) {
    c->num_prompts = 1000;
    if (dataset_name == "random") {
      c->workload = "random";
      c->input_len = 1024;
    } else if (dataset_name == "prefix_repetition") {
      c->workload = "shared-prefix";
      c->prefix_len = 256;
      c->suffix_len = 256;
      c->num_groups = 10;
    } else if (dataset_name == "sharegpt") {
      c->workload = "sharegpt";
    } else {
      keep("--dataset-name must be random, sharegpt or prefix_repetition, got '" + dataset_name + "'");
    }
    c->output_len = 128;
  }
  if (!jsonl.empty()) {
    c->dataset_path = jsonl;
    if (c->workload.empty()) c->workload = "jsonl";
  }
  for (std::string e : {int_option(args, "--num-prompts", 1, 1000000, &c->num_prompts),
                        int_option(args, "--input-len", 1, 1 << 24, &c->input_len),
                        int_option(args, "--random-input-len", 1, 1 << 24, &c->input_len),
                        int_option(args, "--output-len", 1, 1 << 24, &c->output_len),
                        int_option(args, "--random-output-len", 1, 1 << 24, &c->output_len),
                        int_option(args, "--prefix-repetition-output-len", 1, 1 << 24, &c->output_len),
                        int_option(args, "--sharegpt-output-len", 1, 1 << 24, &c->sharegpt_output_len),
                        int_option(args, "--num-groups", 1, 100000, &c->num_groups),
                        int_option(args, "--prefix-repetition-num-prefixes", 1, 100000, &c->num_groups),
                        int_option(args, "--prompts-per-group", 1, 100000, &c->prompts_per_group),
                        int_option(args, "--prefix-len", 0, 1 << 24, &c->prefix_len),
                        int_option(args, "--prefix-repetition-prefix-len", 0, 1 << 24, &c->prefix_len),
                        int_option(args, "--suffix-len", 0, 1 << 24, &c->suffix_len),
                        int_option(args, "--prefix-repetition-suffix-len", 0, 1 << 24, &c->suffix_len),
                        int_option(args, "--max-concurrency", 1, 100000, &c->max_concurrency),
                        double_opt(args, "--range-ratio", 0, 1, &c->range_ratio),
                        double_opt(args, "--random-range-ratio", 0, 1, &c->range_ratio),
                        double_opt(args, "--request-rate", 1e-9, 1e12, &c->request_rate),
                        double_opt(args, "--request-timeout", 1e-3, 1e7, &c->request_timeout_s)}) {
    keep(std::move(e));
  }
  c->num_prompts_given = has_arg(argc, argv, "--num-prompts");
  if (c->workload == "sharegpt" && has_arg(argc, argv, "--output-len") && c->sharegpt_output_len == 0)
    c->sharegpt_output_len = c->output_len;  // vLLM maps --output-len onto every dataset
  if (args.value("--seed", &v) && !parse_int(v, 0, INT64_MAX, &c->seed))
    keep("--seed must be a non-negative integer, got '" + v + "'");
  if (args.value("--percentile-metrics", &v)) keep(parse_percentile_metrics(v, &c->selection.metrics));
  if (args.value("--metric-percentiles", &v)) keep(parse_metric_percentiles(v, &c->selection.percentiles));
  c->append_result = args.flag("--append-result");
  c->save_result = args.flag("--save-result") || c->append_result;
  c->save_detailed = args.flag("--save-detailed");
  const bool dir_given = args.value("--result-dir", &c->result_dir);
  const bool file_given = args.value("--result-filename", &c->result_filename);
  if ((dir_given || file_given || c->save_detailed) && !c->save_result)
    keep("--result-dir, --result-filename and --save-detailed go with --save-result or --append-result");
  c->shuffle = !args.flag("--disable-shuffle");
  c->progress = !args.flag("--disable-tqdm");
  const bool no_ignore_eos = args.flag("--no-ignore-eos");
  const bool ignore_eos = args.flag("--ignore-eos");
  c->as_json = args.flag("--json");
  args.value("--report", &c->report_path);
  args.value("--save-prompts", &c->save_prompts_path);
  // The leftover check, a positional model path, and --gpu-memory-utilization's KV
  // budget (F x RAM minus the model file), as serve applies them.
  keep(finish_engine_flags(args, &c->engine));
  if (!err.empty()) return err;

  if (c->workload.empty())
    return "give --dataset-name random|sharegpt|prefix_repetition, --workload random|shared-prefix or --dataset FILE.jsonl";
  if (!jsonl.empty() && (c->vllm_dataset || c->workload != "jsonl"))
    return "give one of --dataset, --workload and --dataset-name";
  if (c->workload != "random" && c->workload != "shared-prefix" && c->workload != "copy" &&
      c->workload != "copy-long" && c->workload != "sharegpt" && c->workload != "jsonl")
    return "--workload must be random, shared-prefix, copy or copy-long, got '" + c->workload + "'";
  if (c->workload == "sharegpt" && c->dataset_path.empty()) return "--dataset-name sharegpt needs --dataset-path FILE.json";
  if (c->vllm_dataset && c->workload != "sharegpt" && !c->dataset_path.empty())
    return "--dataset-path goes with --dataset-name sharegpt, not " + dataset_name;
  if (c->workload == "shared-prefix" && c->prefix_len + c->suffix_len < 1)
    return "--prefix-len + --suffix-len must be at least 1";
  if (c->vllm_dataset && c->workload == "shared-prefix") {
    // vLLM's prefix_repetition: num_prompts split over the prefixes.
    c->prompts_per_group = c->num_prompts / c->num_groups;
    if (c->prompts_per_group == 0)
      return "--num-prompts (" + std::to_string(c->num_prompts) + ") must be at least --prefix-repetition-num-prefixes (" +
             std::to_string(c->num_groups) + ")";
  }
  // vLLM ignores EOS for random prompts only; pagoda's shared-prefix workload too.
  const bool random_ids = c->workload == "random" || (c->workload == "shared-prefix" && !c->vllm_dataset);
  c->ignore_eos = random_ids ? !no_ignore_eos : ignore_eos && !no_ignore_eos;
  return "";
}

}  // namespace bench

namespace {

// A one-line "\r" counter on stdout, only when stdout is a terminal and the run
// has lasted a second (short runs and pipes get none), at most 10 times a second.
struct Progress {
  bool on = false;
  double t0 = now_seconds(), last = 0;
  bool shown = false;
  void operator()(size_t done, size_t total) {
    const double t = now_seconds();
    if (!on || t - t0 < 1.0 || (t - last < 0.1 && done < total)) return;
    last = t;
    shown = true;
    std::printf("\r%zu/%zu requests done, %.0f s", done, total, t - t0);
    std::fflush(stdout);
  }
  void clear() {
    if (shown) std::printf("\r\033[K");
  }
};

int fail(const std::string& msg, int rc = 1) {
  std::fprintf(stderr, "pagoda bench: %s\n", msg.c_str());
  return rc;
}

}  // namespace

int bench_serving_main(int argc, char** argv) {
  bench::ServingConfig c;
  bool help = false;
  const std::string err = bench::parse_serving_args(argc, argv, &c, &help);
  if (help) return print_usage(kServingHelp, kEngineFlagsHelp);
  if (!err.empty()) return fail(err, 2);
  if (c.workload == "shared-prefix" && !c.vllm_dataset && c.num_prompts_given)
    std::fprintf(stderr, "pagoda bench: --num-prompts is ignored by shared-prefix (G x R requests)\n");

  // The engine (offline) or just the tokenizer (server mode) from the -m model.
  std::unique_ptr<engine::Engine> eng;
  std::unique_ptr<gguf::GgufFile> tok_file;
  std::unique_ptr<tok::Tokenizer> own_tok;
  const tok::Tokenizer* tk = nullptr;
  if (c.server_url.empty()) {
    auto e = engine::Engine::create(c.engine);
    if (!e.ok()) return fail(e.message());
    eng = std::move(e).value();
    tk = &eng->tokenizer();
  } else {
    auto f = gguf::GgufFile::open(c.engine.model_path);
    if (!f.ok()) return fail("tokenizer model: " + f.message());
    tok_file = std::move(f).value();
    auto t = tok::Tokenizer::from_gguf(*tok_file);
    if (!t.ok()) return fail("tokenizer of " + c.engine.model_path + ": " + t.message());
    own_tok = std::move(t).value();
    tk = own_tok.get();
  }

  const uint64_t seed = static_cast<uint64_t>(c.seed);
  std::vector<loadgen::BenchRequest> reqs;
  if (c.workload == "jsonl" || c.workload == "sharegpt") {
    auto d = c.workload == "jsonl"
                 ? loadgen::load_dataset(c.dataset_path, *tk, c.output_len, c.num_prompts_given ? c.num_prompts : 0)
                 : loadgen::load_sharegpt(c.dataset_path, *tk, c.num_prompts, c.sharegpt_output_len, seed, c.shuffle);
    if (!d.ok()) return fail(d.message());
    reqs = std::move(d).value();
  } else if (c.workload == "copy" || c.workload == "copy-long") {  // loadgen/copy_workload.cc
    auto w = loadgen::make_copy_workload(*tk, c.num_prompts, c.output_len, seed,
                                       c.workload == "copy" ? loadgen::CopyLength::kShort : loadgen::CopyLength::kLong);
    if (!w.ok()) return fail(w.message());
    reqs = std::move(w).value();
  } else {
    const loadgen::TokenSpace space = loadgen::token_space(*tk);
    if (space.ordinary.empty()) return fail("the vocabulary has no ordinary tokens to build random prompts from");
    reqs = c.workload == "random"
               ? loadgen::make_random_workload(space, c.num_prompts, c.input_len, c.output_len, c.range_ratio, seed)
               : loadgen::make_shared_prefix_workload(space, c.num_groups, c.prompts_per_group, c.prefix_len,
                                                    c.suffix_len, c.output_len, seed);
  }
  const bool chat = c.endpoint == "/v1/chat/completions";
  if (chat) {
    if (c.server_url.empty()) return fail("--endpoint /v1/chat/completions needs a server (--base-url)", 2);
    // A chat message is text: token-id workloads send their prompts decoded.
    for (loadgen::BenchRequest& r : reqs)
      if (r.text.empty()) r.text = tk->decode(r.prompt);
  }
  if (!c.save_prompts_path.empty()) {  // e.g. bench/spec_decode_openai.py's copy workload
    std::ofstream out(c.save_prompts_path);
    for (const loadgen::BenchRequest& r : reqs)
      out << nlohmann::json{{"prompt", r.text.empty() ? tk->decode(r.prompt) : r.text}, {"max_tokens", r.max_tokens}}.dump()
          << "\n";
    if (!out.flush()) return fail("cannot write " + c.save_prompts_path);
    return 0;
  }

  Progress progress;
  progress.on = c.progress && isatty(STDOUT_FILENO);
  loadgen::RunOptions ro;
  ro.max_concurrency = c.max_concurrency;
  ro.request_rate = c.request_rate;
  ro.seed = seed;
  ro.ignore_eos = c.ignore_eos;
  ro.progress = std::ref(progress);
  RunRecorder recorder;  // --report FILE.html (cli/run_report.h)
  if (!c.report_path.empty()) {
    ro.on_step = [&recorder](const engine::EngineStats& st) { recorder.on_engine_stats(st); };
    ro.on_scrape = [&recorder](const std::string& m) { recorder.on_metrics(m); };
  }
  loadgen::RunExtras extras;
  std::vector<loadgen::RequestResult> results;
  std::string served_model;
  if (c.server_url.empty()) {
    results = loadgen::run_offline(*eng, reqs, ro, &extras);
    served_model = eng->model_info().name;
  } else {
    auto url = loadgen::parse_server_url(c.server_url);
    if (!url.ok()) return fail(url.message(), 2);
    loadgen::ServerRunOptions so;
    so.run = ro;
    so.model_name = c.model_name;
    so.api_key = c.api_key;
    so.request_timeout_s = c.request_timeout_s;
    so.endpoint = c.endpoint;
    results = loadgen::run_server(*url, reqs, &so, &extras);
    served_model = so.model_name;
    ro.max_concurrency = so.run.max_concurrency;
  }
  progress.clear();

  loadgen::Summary s = loadgen::summarize(results, extras);
  s.mode = c.server_url.empty() ? "offline" : "server";
  s.workload = c.workload == "jsonl" ? "dataset:" + c.dataset_path
               : c.workload == "sharegpt" ? "sharegpt:" + c.dataset_path
                                          : c.workload;
  s.model = served_model;
  s.max_concurrency = ro.max_concurrency;
  s.request_rate = c.request_rate;
  s.seed = seed;
  if (eng) {
    s.kv_cache_blocks = eng->model_info().num_kv_blocks;
    s.kv_cache_bytes = eng->model_info().kv_cache_bytes;
  }
  if (c.as_json) {
    std::printf("%s\n", loadgen::format_json(s).c_str());
  } else {
    std::printf("%s", loadgen::format_report(s, c.selection).c_str());
  }
  int rc = s.completed > 0 ? 0 : 1;
  if (c.save_result) {
    loadgen::ResultMeta meta;
    meta.date = loadgen::time_string("%Y%m%d-%H%M%S", /*utc=*/false);  // vLLM's naming
    // vLLM's backend names; "offline" for the in-process engine (no server behind it).
    meta.backend = c.server_url.empty() ? "offline" : chat ? "openai-chat" : c.backend;
    meta.label = c.label;
    meta.model_id = served_model;
    meta.tokenizer_id = c.engine.model_path;
    meta.num_prompts = static_cast<int>(reqs.size());
    meta.detailed = c.save_detailed;
    std::string name = c.result_filename.empty()
                           ? loadgen::default_result_filename(c.label.empty() ? meta.backend : c.label, c.request_rate,
                                                            c.max_concurrency, served_model, meta.date)
                           : c.result_filename;
    std::error_code ec;
    if (!c.result_dir.empty()) {
      std::filesystem::create_directories(c.result_dir, ec);
      if (ec) return fail("--result-dir " + c.result_dir + ": " + ec.message());
      name = (std::filesystem::path(c.result_dir) / name).string();
    }
    std::ofstream out(name, c.append_result ? std::ios::app : std::ios::trunc);
    out << loadgen::format_vllm_result(s, c.selection, meta, results) << "\n";
    out.close();
    if (!out) return fail("--save-result: cannot write " + name);
    std::fprintf(stderr, "pagoda bench: result saved to %s\n", name.c_str());
  }
  if (!s.first_error.empty()) std::fprintf(stderr, "pagoda bench: first failure: %s\n", s.first_error.c_str());
  if (!c.report_path.empty()) {
    const Status w = recorder.write(c.report_path, "bench " + s.workload + " · " + s.model, loadgen::format_json(s));
    if (!w.ok()) return fail(w.message());
    std::fprintf(stderr, "pagoda bench: wrote %s (%zu points)\n", c.report_path.c_str(), recorder.num_points());
  }
  std::fflush(stdout);
  return rc;
}

namespace {
const Register kBenchServing("bench-serving", "serving benchmark (same as bench --dataset-name/--workload/--server)",
                             bench_serving_main);
}  // namespace

}  // namespace pagoda::cli
