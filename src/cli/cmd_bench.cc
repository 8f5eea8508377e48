// pagoda bench: llama-bench style single-sequence throughput, with llama-bench's
// flags and output formats (cli/bench_llama.h parses and prints; this file runs).
//   pp: prefill `pp` random tokens (seeded), in steps of -b tokens (one pass by default).
//   tg: after a short untimed prompt, decode `tg` tokens one at a time (greedy, so the
//       generated ids are hashed and a faster run that changed the answer shows).
//   pp+tg (-pg): the prefill and the decode steps after it, timed together.
// One warm-up, then `-r` repetitions: t/s mean and standard deviation as llama-bench
// gives them, and the achieved weight-read bandwidth of decode as a fraction of the
// read bandwidth this machine delivers to the same thread count (measured here, after
// the runs: a multi-threaded streaming read of 1 GiB, best of 10 passes with 64-byte loads).
// --ctx-sweep: ms per decode step at several contexts, with the KV cache and
// with full recomputation (the "KV cache vs recompute" table).
// Everything runs through engine::Engine (the path of run and serve), stepped by the
// load driver (loadgen/driver.h, its timer around Engine::step()): one request at a
// time, prefix caching off (a repetition must not hit the cache of the previous one).
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/ggml_types.h"
#include "base/hash.h"
#include "base/kv_dtype.h"
#include "base/rng.h"
#include "base/timer.h"
#include "cli/bench_llama.h"
#include "cli/bench_serving_cli.h"
#include "cli/cli_util.h"
#include "cli/command.h"
#include "cli/engine_flags.h"
#include "engine/engine.h"
#include "gguf/gguf.h"
#include "loadgen/driver.h"
#include "loadgen/read_bandwidth.h"
#include "loadgen/report.h"

namespace pagoda::cli {
namespace {

constexpr int32_t kTgPromptTokens = 8;
constexpr int32_t kSweepDecodeSteps = 8;
const int64_t kSweepContexts[] = {64, 256, 1024, 2048};

const char* kBenchUsage =
    "usage: pagoda bench [llama-bench flags] [--ctx-sweep] [--json]\n"
    "Single-stream throughput, flags and output as llama.cpp's llama-bench. Each list flag takes\n"
    "comma lists and ranges (128,512 or 64-512*2) and may repeat; the tests are the cross product\n"
    "(model, batch, ubatch, threads; then every pp, tg and pp+tg test), in llama-bench's order.\n"
    "Flags go through the parser of every subcommand: --name=VALUE, --n_prompt for --n-prompt, and\n"
    "PAGODA_<LONG NAME> for a flag not given (PAGODA_N_PROMPT=128,512 PAGODA_THREADS=4 PAGODA_OUTPUT=json).\n"
    "\n"
    "  -m, --model LIST      GGUF models (default: $PAGODA_MODEL or models/SmolLM2-135M-Instruct.Q4_1.gguf);\n"
    "                        also as positional arguments (`pagoda bench MODEL`)\n"
    "  -p, --n-prompt LIST   prompt tokens prefilled, test ppN (default 512; 0 = none); --pp N is the same\n"
    "  -n, --n-gen LIST      tokens decoded one at a time, test tgN (default 128; 0 = none); --tg N the same\n"
    "  -pg PP,TG             a prefill of PP tokens then TG decoded tokens, timed together (repeatable)\n"
    "  -r, --repetitions N   timed repetitions after one warm-up (default 5)\n"
    "  -t, --threads LIST    CPU threads (default: all cores)\n"
    "  -b, --batch-size LIST tokens per prefill step (default 2048; longer prompts take several steps)\n"
    "  -ub, --ubatch-size LIST  accepted and reported; pagoda has no separate micro-batch\n"
    "  -d, --n-depth LIST    tokens already in the context (computed once, untimed, then served by\n"
    "                        the prefix cache); tests named \"pp512 @ d1024\" (default 0)\n"
    "  -o, --output FMT      md (default) | csv | json | jsonl, with llama-bench's columns and fields\n"
    "  --progress            one line per test on stderr;  --no-warmup  skip the warm-up\n"
    "  -ngl, -fa, -nkvo, -mmp  accepted with a warning (GPU options; pagoda runs on the CPU)\n"
    "\n"
    "pagoda's own:\n"
    "      --kv-dtype T    f32 | f16 | bf16 | q8_0 | q4_0 | q4_1 | iq4_nl | q5_0 | q5_1 (default f16), K and\n"
    "                      V; or --kv-cache-dtype; -ctk T / -ctv T each alone\n"
    "      --block-size N  KV block size (default 16)\n"
    "      --state-checkpoint-interval K   hybrid models: a state checkpoint every K blocks, used by -d's\n"
    "                      prefix hit (default 4; 0 = off)\n"
    "      --seed S        seed of the random token ids (default 1234)\n"
    "      --ctx-sweep     also time decode steps at contexts 64..2048, cached vs recomputed\n"
    "      --no-bandwidth  skip measuring the machine's read bandwidth (1 GiB, about a second)\n"
    "      --json          the summary object of earlier pagoda versions (one pp and one tg test)\n"
    "\n"
    "tg times N decode steps after an 8-token prompt (not timed); pp one prefill of N random tokens;\n"
    "t/s is (pp + tg) tokens / time, mean \xC2\xB1 standard deviation over the repetitions. tg's weight\n"
    "reads are also given as a share of the read bandwidth this machine delivers to the same threads\n"
    "(\"% read bw\"; fields weight_gb_per_s, read_gb_per_s, read_bw_fraction in csv/json).\n"
    "\n"
    "Serving workloads (many requests through the engine or an HTTP server, vLLM's `bench serve`\n"
    "flags): pass --dataset-name, --workload, --dataset, --base-url or --server; see\n"
    "`pagoda bench-serving --help`.\n";
struct Stats {
  double median = 0, min = 0, max = 0;
};

Stats summarize(std::vector<double> v) {
  Stats s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  s.median = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  s.min = v.front();
  s.max = v.back();
  return s;
}

std::vector<int32_t> random_tokens(Rng& rng, int64_t n, int32_t n_vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(rng.uniform_int(0, n_vocab - 1));
  return t;
}

int fail(const std::string& msg) {
  std::fprintf(stderr, "pagoda bench: %s\n", msg.c_str());
  return 1;
}

// One greedy request of `max_tokens` tokens; returns the seconds of its
// engine steps, the first (the prefill, which samples the first token) and the
// decode steps after it, and the generated tokens in *out.
struct RequestTimes {
  double prefill_s = 0;
  double decode_s = 0;
  int64_t decode_steps = 0;
  int64_t cached_tokens = 0;  // prompt tokens the prefix cache supplied
};
Expected<RequestTimes> run_request(engine::Engine& eng, const std::vector<int32_t>& prompt, int64_t max_tokens,
                                   std::vector<int32_t>* out) {
  engine::RequestParams p;
  p.prompt = prompt;
  p.max_tokens = static_cast<int>(max_tokens);
  p.temperature = 0.0f;
  p.ignore_eos = true;  // the token count is the test's, whatever the model says
  out->clear();
  PAGODA_ASSIGN_OR_RETURN(loadgen::Stream s, loadgen::run_one(eng, p));
  *out = std::move(s.tokens);
  return RequestTimes{s.prefill_s, s.decode_s, s.decode_steps, s.cached_tokens};
}

// Prefill of `tokens` in one forward pass; returns seconds.
Expected<double> time_prefill(engine::Engine& eng, const std::vector<int32_t>& tokens) {
  std::vector<int32_t> out;
  PAGODA_ASSIGN_OR_RETURN(RequestTimes t, run_request(eng, tokens, 1, &out));
  return t.prefill_s;
}

// Greedy decode of n tokens after `prompt`: n decode steps (the prompt's step
// excluded), each feeding the previous token; *out gets the n tokens fed, the
// first chosen by the prompt's step. Returns the decode seconds.
Expected<double> time_decode(engine::Engine& eng, const std::vector<int32_t>& prompt, int64_t n,
                             std::vector<int32_t>* out) {
  PAGODA_ASSIGN_OR_RETURN(RequestTimes t, run_request(eng, prompt, n + 1, out));
  out->resize(static_cast<size_t>(n));  // the token of the last step is not fed
  return t.decode_s;
}

// True when the arguments ask for a serving workload (bench_serving_cli.cc): pagoda's
// serving flags and the ones of vLLM's `bench serve`.
bool wants_serving(int argc, char** argv) {
  static const char* const kServingFlags[] = {"--workload",    "--dataset",    "--server",     "--dataset-name",
                                              "--dataset-path", "--base-url",  "--endpoint",   "--backend",
                                              "--num-prompts", "--request-rate", "--max-concurrency",
                                              "--save-result", "--host",       "--port"};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    a = a.substr(0, a.find('='));
    if (a.rfind("--", 0) == 0) std::replace(a.begin(), a.end(), '_', '-');  // --dataset_name, as cli::Args reads it
    for (const char* f : kServingFlags)
      if (a == f) return true;
  }
  // The workload selectors from the environment too (cli::Args's PAGODA_<NAME>); not
  // PAGODA_HOST/PORT, which a shell set up for `pagoda serve` may hold.
  for (const char* e : {"PAGODA_WORKLOAD", "PAGODA_DATASET", "PAGODA_DATASET_NAME", "PAGODA_BASE_URL", "PAGODA_SERVER"})
    if (std::getenv(e)) return true;
  return false;
}

// llama-bench's model columns from the GGUF: tensor bytes and elements, and
// "ARCH SIZE TYPE" with the type that holds most of the bytes.
Expected<llb::ModelDesc> describe_model(const std::string& path) {
  PAGODA_ASSIGN_OR_RETURN(std::unique_ptr<gguf::GgufFile> f, gguf::GgufFile::open(path));
  llb::ModelDesc d;
  d.filename = path;
  std::map<std::string, uint64_t> bytes_by_type;
  for (const gguf::TensorInfo& t : f->tensors()) {
    d.size += t.n_bytes;
    d.n_params += t.n_elements;
    bytes_by_type[ggml_type_info(t.type).name] += t.n_bytes;
  }
  std::string type = "?";
  uint64_t most = 0;
  for (const auto& [name, b] : bytes_by_type) {
    if (b > most) {
      most = b;
      type = name;
    }
  }
  std::transform(type.begin(), type.end(), type.begin(), [](unsigned char c) { return std::toupper(c); });
  char size[32];
  if (d.n_params >= 1000000000ull) std::snprintf(size, sizeof size, "%.1fB", d.n_params / 1e9);
  else if (d.n_params >= 1000000ull) std::snprintf(size, sizeof size, "%.0fM", d.n_params / 1e6);
  else std::snprintf(size, sizeof size, "%.0fK", d.n_params / 1e3);
  d.type = f->architecture() + " " + size + " " + type;
  return d;
}

// Positions a test computes: the depth, the prompt (tg without a depth: kTgPromptTokens)
// and its fed tokens.
int64_t test_positions(const llb::Instance& i) {
  if (i.n_prompt == 0) return (i.n_depth > 0 ? i.n_depth : kTgPromptTokens) + i.n_gen;
  return i.n_depth + i.n_prompt + i.n_gen;
}

struct SweepRow {
  int64_t ctx;
  double cached_ms, recompute_ms;
};

// ms per decode step at each context, with the cache and recomputing everything.
Expected<std::vector<SweepRow>> ctx_sweep(engine::Engine& eng, const std::vector<int64_t>& contexts, int64_t reps,
                                          uint64_t seed) {
  Rng rng(seed);
  std::vector<SweepRow> rows;
  std::vector<int32_t> generated;
  const int32_t n_vocab = eng.model_info().vocab_size;
  for (int64_t c : contexts) {
    const std::vector<int32_t> ctx_tokens = random_tokens(rng, c + 1, n_vocab);
    const std::vector<int32_t> prefix(ctx_tokens.begin(), ctx_tokens.end() - 1);
    PAGODA_ASSIGN_OR_RETURN(double dec, time_decode(eng, prefix, kSweepDecodeSteps, &generated));
    // Without a cache a decode step at context c recomputes all c + 1 tokens:
    // the work (and the time) of a prefill of c + 1 tokens.
    std::vector<double> re;
    for (int64_t i = 0; i < std::min<int64_t>(reps, 2); ++i) {
      PAGODA_ASSIGN_OR_RETURN(double s, time_prefill(eng, ctx_tokens));
      re.push_back(s * 1e3);
    }
    rows.push_back({c, dec * 1e3 / kSweepDecodeSteps, summarize(re).median});
  }
  return rows;
}

// Earlier versions' --json object: one pp and one tg test, median/min/max t/s.
std::string legacy_json(const llb::Options& o, const std::vector<llb::Result>& results,
                        const engine::ModelInfo& info, const std::vector<SweepRow>& rows) {
  const llb::Result* pp = nullptr;
  const llb::Result* tg = nullptr;
  for (const llb::Result& r : results) {
    if (r.inst.n_gen == 0) pp = &r;
    if (r.inst.n_prompt == 0) tg = &r;
  }
  const Stats pps = pp ? summarize(pp->samples_ts()) : Stats{};
  const Stats tgs = tg ? summarize(tg->samples_ts()) : Stats{};
  const double tg_gbs = tgs.median * static_cast<double>(info.weight_bytes_per_token) / 1e9;
  nlohmann::json j;
  j["model"] = o.models[0];
  j["arch"] = info.architecture;
  j["threads"] = o.n_threads[0];
  j["isa"] = info.isa;
  j["kv_dtype"] = kv_types_name(o.kv_dtype);
  j["reps"] = o.reps;
  j["pp_tokens"] = pp ? pp->inst.n_prompt : 0;
  j["tg_tokens"] = tg ? tg->inst.n_gen : 0;
  j["pp_tokens_per_s"] = pps.median;
  j["pp_tokens_per_s_min"] = pps.min;
  j["pp_tokens_per_s_max"] = pps.max;
  j["tg_tokens_per_s"] = tgs.median;
  j["tg_tokens_per_s_min"] = tgs.min;
  j["tg_tokens_per_s_max"] = tgs.max;
  j["weight_bytes_per_token"] = info.weight_bytes_per_token;
  j["tg_gb_per_s"] = tg_gbs;
  j["cpu"] = loadgen::cpu_model_name();
  if (tg && tg->read_gb_per_s > 0) {
    j["read_gb_per_s"] = tg->read_gb_per_s;
    j["tg_fraction_of_read_bw"] = tg_gbs / tg->read_gb_per_s;
  }
  j["tg_tokens_hash"] = tg ? tg->tokens_hash : "0x0000000000000000";
  j["tg_tokens_consistent"] = tg ? tg->tokens_consistent : true;
  if (!rows.empty()) {
    j["ctx_sweep"] = nlohmann::json::array();
    for (const SweepRow& r : rows) {
      j["ctx_sweep"].push_back(
          {{"context", r.ctx}, {"cached_ms_per_step", r.cached_ms}, {"recompute_ms_per_step", r.recompute_ms}});
    }
  }
  return j.dump();
}

std::string sweep_table(const std::vector<SweepRow>& rows) {
  std::string o = "\nKV cache vs recompute (ms per decode step)\n"
                  "| context | with KV cache | recompute | speedup |\n"
                  "|---------|---------------|-----------|---------|\n";
  char buf[128];
  for (const SweepRow& r : rows) {
    std::snprintf(buf, sizeof buf, "| %7" PRId64 " | %13.2f | %9.2f | %6.1fx |\n", r.ctx, r.cached_ms, r.recompute_ms,
                  r.recompute_ms / r.cached_ms);
    o += buf;
  }
  return o;
}

#ifndef PAGODA_GIT_COMMIT
#define PAGODA_GIT_COMMIT "unknown"
#endif

int run_bench(int argc, char** argv) {
  if (wants_serving(argc, argv)) return bench_serving_main(argc, argv);
  llb::Options o;
  bool help = false;
  const std::string perr = llb::parse_options(argc, argv, default_model_path(), threads_or_all(0), &o, &help);
  if (const std::optional<int> rc = help_or_usage_error("bench", help, perr, kBenchUsage)) return *rc;
  for (const std::string& w : o.warnings) std::fprintf(stderr, "pagoda bench: %s\n", w.c_str());
  const std::vector<llb::Instance> tests = llb::instances(o);

  // One engine per (model, threads, batch), sized for every test it runs: llama-bench's
  // order keeps those tests together. The engine's context has one more position than
  // the tests compute: the token sampled last is never fed.
  auto same_engine = [](const llb::Instance& a, const llb::Instance& b) {
    return a.model == b.model && a.n_threads == b.n_threads && a.n_batch == b.n_batch;
  };
  std::vector<int64_t> sweep;
  if (o.ctx_sweep) sweep.assign(std::begin(kSweepContexts), std::end(kSweepContexts));
  int64_t positions = 0;
  bool caching = false;
  for (const llb::Instance& t : tests) {
    positions = std::max(positions, test_positions(t));
    caching = caching || t.n_depth > 0;
  }
  const int64_t sweep_positions = sweep.empty() ? 0 : sweep.back() + kSweepDecodeSteps + 1;

  std::unique_ptr<engine::Engine> eng;
  std::map<std::string, llb::ModelDesc> descs;
  std::vector<llb::Result> results;
  std::vector<SweepRow> rows;
  std::optional<engine::ModelInfo> first_info;
  bool consistent = true;
  for (size_t ti = 0; ti < tests.size(); ++ti) {
    const llb::Instance& t = tests[ti];
    if (ti == 0 || !same_engine(t, tests[ti - 1])) {
      eng.reset();  // the previous model's memory goes before the next one loads
      if (!descs.count(t.model)) {
        auto d = describe_model(t.model);
        if (!d.ok()) return fail(t.model + ": " + d.message());
        descs[t.model] = *d;
      }
      engine::EngineConfig ec;
      ec.model_path = t.model;
      ec.threads = static_cast<int>(t.n_threads);
      ec.context_length = static_cast<int>(std::max(positions, ti == 0 ? sweep_positions : 0) + 1);
      ec.kv_dtype = o.kv_dtype;
      ec.block_size = static_cast<int>(o.block_size);
      ec.state_checkpoint_interval = static_cast<int>(o.state_checkpoint_interval);
      ec.kv_pool_one_context = true;
      ec.watermark = 0;                  // one sequence may fill the whole pool
      // Only -d needs the cache (the depth is computed once, untimed); then every
      // repetition prefills fresh prompt tokens, so it cannot hit its predecessor.
      ec.enable_prefix_caching = caching;
      ec.max_num_seqs = 1;
      ec.max_num_batched_tokens = static_cast<int>(std::min<int64_t>(t.n_batch, ec.context_length));
      auto created = engine::Engine::create(ec);
      if (!created.ok()) return fail(t.model + ": " + created.message());
      eng = std::move(created).value();
      const engine::ModelInfo& info = eng->model_info();
      if (positions > info.n_ctx_train) {
        return fail("the tests need " + std::to_string(positions) + " tokens of context, " + t.model + " has " +
                    std::to_string(info.n_ctx_train));
      }
      if (!first_info) first_info = info;
    }
    const engine::ModelInfo& info = eng->model_info();
    if (o.progress) {
      std::fprintf(stderr, "pagoda bench: benchmark %zu/%zu: %s, %" PRId64 " threads\n", ti + 1, tests.size(),
                   llb::test_name(t.n_prompt, t.n_gen, t.n_depth).c_str(), t.n_threads);
    }
    llb::Result r;
    r.inst = t;
    r.model = descs[t.model];
    r.type_k = kv_dtype_name(o.kv_dtype.k);
    r.type_v = kv_dtype_name(o.kv_dtype.v);
    r.test_time = loadgen::time_string("%FT%TZ", /*utc=*/true);  // RFC 3339, as llama-bench
    r.weight_bytes_per_token = info.weight_bytes_per_token;
    // Separate streams so the tg prompt (and its hash) does not depend on -p.
    Rng rng(static_cast<uint64_t>(o.seed));
    Rng tg_rng(static_cast<uint64_t>(o.seed) ^ 0x7467ull);
    Rng depth_rng(static_cast<uint64_t>(o.seed) ^ 0x6470ull);
    const std::vector<int32_t> depth_tokens = random_tokens(depth_rng, t.n_depth, info.vocab_size);
    const std::vector<int32_t> tg_prompt =
        t.n_depth > 0 ? depth_tokens : random_tokens(tg_rng, kTgPromptTokens, info.vocab_size);
    // The depth's whole blocks come from the cache; a partial last block is recomputed.
    const int64_t want_cached = t.n_depth / o.block_size * o.block_size;
    std::vector<int32_t> pp_tokens = random_tokens(rng, t.n_prompt, info.vocab_size);
    std::vector<int32_t> generated;
    uint64_t hash = 0;
    for (int64_t rep = o.warmup ? -1 : 0; rep < o.reps; ++rep) {  // rep == -1: warm-up
      double s = 0;
      if (t.n_prompt > 0 && caching) {
        pp_tokens = depth_tokens;
        const std::vector<int32_t> fresh = random_tokens(rng, t.n_prompt, info.vocab_size);
        pp_tokens.insert(pp_tokens.end(), fresh.begin(), fresh.end());
        if (t.n_depth > 0) {  // untimed: the depth into the cache
          auto w = run_request(*eng, depth_tokens, 1, &generated);
          if (!w.ok()) return fail(w.message());
        }
      }
      if (t.n_gen == 0) {
        auto p = run_request(*eng, pp_tokens, 1, &generated);
        if (!p.ok()) return fail(p.message());
        if (p->cached_tokens < want_cached)
          return fail("the depth was not served from the prefix cache (" + std::to_string(p->cached_tokens) +
                      " of " + std::to_string(want_cached) + " tokens)");
        s = p->prefill_s;
      } else if (t.n_prompt == 0) {
        const engine::ThreadPoolCounts pool0 = engine::thread_pool_counts();
        auto d = time_decode(*eng, tg_prompt, t.n_gen, &generated);
        if (!d.ok()) return fail(d.message());
        s = *d;
        if (rep >= 0) {
          const engine::ThreadPoolCounts pool1 = engine::thread_pool_counts();
          r.pool_stalls += pool1.stalls - pool0.stalls;
          r.pool_long_waits += pool1.long_waits - pool0.long_waits;
        }
        const uint64_t h = xxh3_64(generated.data(), generated.size() * sizeof(int32_t));
        if (rep == (o.warmup ? -1 : 0)) hash = h;
        r.tokens_consistent = r.tokens_consistent && h == hash;
      } else {
        auto q = run_request(*eng, pp_tokens, t.n_gen + 1, &generated);  // prefill + n_gen fed tokens
        if (!q.ok()) return fail(q.message());
        if (q->cached_tokens < want_cached) return fail("the depth was not served from the prefix cache");
        s = q->prefill_s + q->decode_s;
      }
      if (rep >= 0) r.samples_ns.push_back(static_cast<uint64_t>(std::llround(s * 1e9)));
    }
    if (t.n_prompt == 0) {
      char hex[19];
      std::snprintf(hex, sizeof hex, "0x%016" PRIx64, hash);
      r.tokens_hash = hex;
    }
    consistent = consistent && r.tokens_consistent;
    results.push_back(std::move(r));
    // The sweep runs once, on the first engine, after its tests.
    if (!sweep.empty() && rows.empty() && (ti + 1 == tests.size() || !same_engine(tests[ti + 1], t))) {
      std::erase_if(sweep, [&](int64_t c) { return c + kSweepDecodeSteps + 1 > info.n_ctx_train; });
      auto sw = ctx_sweep(*eng, sweep, o.reps, static_cast<uint64_t>(o.seed));
      if (!sw.ok()) return fail(sw.message());
      rows = std::move(sw).value();
      sweep.clear();
    }
  }
  eng.reset();

  // After the timed runs, so that its page faults and 1 GiB do not disturb them.
  std::map<int64_t, double> read_gbs;
  for (llb::Result& r : results) {
    if (!o.bandwidth || r.inst.n_prompt != 0) continue;
    if (!read_gbs.count(r.inst.n_threads)) read_gbs[r.inst.n_threads] = loadgen::measure_read_gbs(static_cast<int>(r.inst.n_threads));
    r.read_gb_per_s = read_gbs[r.inst.n_threads];
  }

  if (o.legacy_json) {
    std::printf("%s\n", legacy_json(o, results, *first_info, rows).c_str());
    return consistent ? 0 : 1;
  }
  std::fputs(llb::format_results(results, o, o.format, PAGODA_GIT_COMMIT).c_str(), stdout);
  if (o.format != llb::Format::kMarkdown) {
    // Machine-readable stdout stays one format; the sweep goes to stderr.
    if (!rows.empty()) std::fputs(sweep_table(rows).c_str(), stderr);
    if (!consistent) std::fprintf(stderr, "pagoda bench: the greedy tg tokens DIFFERED between repetitions!\n");
    return consistent ? 0 : 1;
  }
  std::printf("cpu: %s, isa: %s, kv: %s, block size %" PRId64 ", %" PRId64 " reps%s\n", loadgen::cpu_model_name().c_str(),
              first_info->isa, kv_types_name(o.kv_dtype).c_str(), o.block_size, o.reps, o.warmup ? " + 1 warm-up" : "");
  for (const llb::Result& r : results) {
    if (r.inst.n_prompt != 0) continue;
    const std::string name = llb::test_name(0, r.inst.n_gen);
    std::printf("tg: %s, %" PRId64 " threads: %.1f MB of weights read per token -> %.2f GB/s", name.c_str(),
                r.inst.n_threads, static_cast<double>(r.weight_bytes_per_token) / 1e6, r.weight_gb_per_s());
    if (r.read_gb_per_s > 0)
      std::printf(", %.0f%% of the %.1f GB/s this machine reads with %" PRId64 " threads", 100 * r.read_bw_fraction(),
                  r.read_gb_per_s, r.inst.n_threads);
    std::printf("\n%s tokens hash: %s%s\n", name.c_str(), r.tokens_hash.c_str(),
                r.tokens_consistent ? "" : " (DIFFERED between repetitions!)");
    if (r.inst.n_threads > 1)
      std::printf("%s, %" PRId64 " threads: thread pool %" PRId64 " stalls, %" PRId64 " long waits\n", name.c_str(),
                  r.inst.n_threads, r.pool_stalls, r.pool_long_waits);
  }
  if (!rows.empty()) std::fputs(sweep_table(rows).c_str(), stdout);
  return consistent ? 0 : 1;
}

const Register kRegisterBench("bench", "prefill/decode throughput (pp/tg, llama-bench style), --ctx-sweep", run_bench);

}  // namespace
}  // namespace pagoda::cli
