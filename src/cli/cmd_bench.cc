// pagoda bench: llama-bench style single-sequence throughput.
//   pp: prefill `pp` random tokens (seeded) in one forward pass.
//   tg: after a short prompt, decode `tg` tokens one at a time (greedy, so the
//       generated ids are hashed and a faster run that changed the answer shows).
// One warm-up, then `-r` repetitions: median, min and max tokens/s, and the
// achieved weight-read bandwidth of decode against the machine's peak.
// --ctx-sweep: ms per decode step at several contexts, with the KV cache and
// with full recomputation (the "KV cache vs recompute" table).
// Everything runs through engine::Engine (the path of run and serve): one
// request at a time, prefix caching off (a repetition must not hit the cache of
// the previous one), a token budget that takes every prompt in one pass, and
// the timer around Engine::step().
#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "base/hash.h"
#include "base/kv_dtype.h"
#include "base/rng.h"
#include "base/timer.h"
#include "cli/bench_serving.h"
#include "cli/cli_util.h"
#include "cli/command.h"
#include "cli/engine_flags.h"
#include "engine/engine.h"

namespace pagoda::cli {
namespace {

constexpr double kPeakReadGBs = 30.0;  // this machine's measured memory read bandwidth
constexpr int32_t kTgPromptTokens = 8;
constexpr int32_t kSweepDecodeSteps = 8;
const int64_t kSweepContexts[] = {64, 256, 1024, 2048};

const char* kBenchUsage =
    "usage: pagoda bench [-m MODEL] [--pp N] [--tg N] [-r N] [-t N] [--json] [--ctx-sweep]\n"
    "\n"
    "  -m, --model PATH    GGUF model (default: $PAGODA_MODEL or models/SmolLM2-135M-Instruct.Q4_1.gguf)\n"
    "      --pp N          prompt tokens prefilled in one pass (default 512; 0 = skip)\n"
    "      --tg N          tokens decoded one at a time (default 128; 0 = skip)\n"
    "  -r, --reps N        repetitions after one warm-up (default 5)\n"
    "  -t, --threads N     CPU threads (default: all cores)\n"
    "      --kv-dtype T    f32 | f16 | bf16 | q8_0 (default f16); or --kv-cache-dtype, -ctk T -ctv T\n"
    "      --block-size N  KV block size (default 16)\n"
    "      --seed S        seed of the random token ids (default 1234)\n"
    "      --ctx-sweep     also time decode steps at contexts 64..2048, cached vs recomputed\n"
    "      --json          one JSON object on stdout\n"
    "\n"
    "Serving workloads (many requests through the engine or an HTTP server): pass\n"
    "--workload, --dataset or --server; see `pagoda bench-serving --help`.\n";

struct BenchOptions {
  std::string model;
  int64_t pp = 512, tg = 128, reps = 5, threads = 0, block_size = 16, seed = 1234;
  KvDtype kv_dtype = KvDtype::F16;
  bool json = false, ctx_sweep = false;
};

std::string parse_args(int argc, char** argv, BenchOptions* o, bool* help) {
  KvDtypeFlags kv_flags;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      *help = true;
      return "";
    }
    if (a == "--json") {
      o->json = true;
      continue;
    }
    if (a == "--ctx-sweep") {
      o->ctx_sweep = true;
      continue;
    }
    if (i + 1 >= argc) return "option " + a + " needs a value (or is unknown)";
    const char* v = argv[++i];
    bool ok = true;
    if (a == "-m" || a == "--model") {
      o->model = v;
    } else if (a == "--pp") {
      ok = parse_i64(v, &o->pp) && o->pp >= 0 && o->pp <= (1 << 20);
    } else if (a == "--tg") {
      ok = parse_i64(v, &o->tg) && o->tg >= 0 && o->tg <= (1 << 20);
    } else if (a == "-r" || a == "--reps") {
      ok = parse_i64(v, &o->reps) && o->reps >= 1 && o->reps <= 1000;
    } else if (a == "-t" || a == "--threads") {
      ok = parse_i64(v, &o->threads) && o->threads >= 1 && o->threads <= 1024;
    } else if (a == "--block-size") {
      ok = parse_i64(v, &o->block_size) && o->block_size >= 1 && o->block_size <= 4096;
    } else if (a == "--seed") {
      ok = parse_i64(v, &o->seed);
    } else if (kv_flags.take(a, v, &ok)) {
      // --kv-dtype, -ctk, -ctv: resolved after the loop
    } else {
      return "unknown option " + a;
    }
    if (!ok) return "bad value '" + std::string(v) + "' for " + a;
  }
  if (std::string err = kv_flags.resolve(&o->kv_dtype); !err.empty()) return err;
  return "";
}

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
};
Expected<RequestTimes> run_request(engine::Engine& eng, const std::vector<int32_t>& prompt, int64_t max_tokens,
                                   std::vector<int32_t>* out) {
  engine::RequestParams p;
  p.prompt = prompt;
  p.max_tokens = static_cast<int>(max_tokens);
  p.temperature = 0.0f;
  p.ignore_eos = true;  // the token count is the test's, whatever the model says
  out->clear();
  PAGODA_ASSIGN_OR_RETURN(engine::RequestId id, eng.add_request(p));
  RequestTimes t;
  while (eng.has_unfinished()) {
    Timer step;
    const std::vector<engine::TokenEvent> events = eng.step();
    const double s = step.seconds();
    for (const engine::TokenEvent& ev : events) {
      if (ev.id != id) continue;
      if (ev.finish == engine::FinishReason::kError) return errorf("%s", ev.error.c_str());
      out->insert(out->end(), ev.tokens.begin(), ev.tokens.end());
    }
    if (out->size() <= 1) {
      t.prefill_s += s;
    } else {
      t.decode_s += s;
      ++t.decode_steps;
    }
  }
  return t;
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

// True when the arguments ask for a serving workload (bench_serving.cc).
bool wants_serving(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    for (const char* f : {"--workload", "--dataset", "--server"}) {
      const size_t n = std::strlen(f);
      if (std::strncmp(argv[i], f, n) == 0 && (argv[i][n] == '\0' || argv[i][n] == '=')) return true;
    }
  }
  return false;
}

int run_bench(int argc, char** argv) {
  if (wants_serving(argc, argv)) return bench_serving_main(argc, argv);
  BenchOptions o;
  bool help = false;
  const std::string perr = parse_args(argc, argv, &o, &help);
  if (const std::optional<int> rc = help_or_usage_error("bench", help, perr, kBenchUsage)) return *rc;
  if (o.model.empty()) o.model = default_model_path();
  const int threads = threads_or_all(o.threads);
  // Positions the tests compute (pp, the tg prompt + tg fed tokens, a sweep
  // context + its decode steps); the model must have them. The engine's context
  // has one more: the token sampled last is never fed.
  std::vector<int64_t> sweep;
  if (o.ctx_sweep) sweep.assign(std::begin(kSweepContexts), std::end(kSweepContexts));
  auto positions = [&] {
    int64_t n = std::max<int64_t>(o.pp, kTgPromptTokens + o.tg);
    if (!sweep.empty()) n = std::max(n, sweep.back() + kSweepDecodeSteps + 1);
    return n;
  };

  engine::EngineConfig ec;
  ec.model_path = o.model;
  ec.threads = threads;
  ec.context_length = static_cast<int>(positions() + 1);
  ec.kv_dtype = o.kv_dtype;
  ec.block_size = static_cast<int>(o.block_size);
  ec.kv_pool_one_context = true;
  ec.watermark = 0;                  // one sequence may fill the whole pool
  ec.enable_prefix_caching = false;  // a repetition must compute its prompt again
  ec.max_num_seqs = 1;
  ec.max_num_batched_tokens = ec.context_length;  // every prefill is one pass
  auto created = engine::Engine::create(ec);
  if (!created.ok()) return fail(o.model + ": " + created.message());
  engine::Engine& eng = **created;
  const engine::ModelInfo& info = eng.model_info();
  // Only the sweep contexts the model has room for.
  std::erase_if(sweep, [&](int64_t c) { return c + kSweepDecodeSteps + 1 > info.n_ctx_train; });
  if (positions() > info.n_ctx_train) {
    return fail("the test needs " + std::to_string(positions()) + " tokens of context, the model has " +
                std::to_string(info.n_ctx_train));
  }

  // Separate streams so the tg prompt (and its hash) does not depend on --pp.
  Rng rng(static_cast<uint64_t>(o.seed));
  Rng tg_rng(static_cast<uint64_t>(o.seed) ^ 0x7467ull);
  const std::vector<int32_t> pp_tokens = random_tokens(rng, o.pp, info.vocab_size);
  const std::vector<int32_t> tg_prompt = random_tokens(tg_rng, kTgPromptTokens, info.vocab_size);
  std::vector<double> pp_tps, tg_tps;
  std::vector<int32_t> generated;
  uint64_t tg_hash = 0;
  bool tg_consistent = true;
  for (int64_t r = -1; r < o.reps; ++r) {  // r == -1: warm-up
    if (o.pp > 0) {
      auto s = time_prefill(eng, pp_tokens);
      if (!s.ok()) return fail(s.message());
      if (r >= 0) pp_tps.push_back(static_cast<double>(o.pp) / *s);
    }
    if (o.tg > 0) {
      auto s = time_decode(eng, tg_prompt, o.tg, &generated);
      if (!s.ok()) return fail(s.message());
      const uint64_t h = xxh3_64(generated.data(), generated.size() * sizeof(int32_t));
      if (r == -1) tg_hash = h;
      tg_consistent = tg_consistent && h == tg_hash;
      if (r >= 0) tg_tps.push_back(static_cast<double>(o.tg) / *s);
    }
  }
  const Stats pp = summarize(pp_tps), tg = summarize(tg_tps);
  const double bytes_per_token = static_cast<double>(info.weight_bytes_per_token);
  const double tg_gbs = tg.median * bytes_per_token / 1e9;

  struct SweepRow {
    int64_t ctx;
    double cached_ms, recompute_ms;
  };
  std::vector<SweepRow> rows;
  if (!sweep.empty()) {
    const int64_t reps = std::min<int64_t>(o.reps, 2);
    for (int64_t c : sweep) {
      const std::vector<int32_t> ctx_tokens = random_tokens(rng, c + 1, info.vocab_size);
      const std::vector<int32_t> prefix(ctx_tokens.begin(), ctx_tokens.end() - 1);
      auto dec = time_decode(eng, prefix, kSweepDecodeSteps, &generated);
      if (!dec.ok()) return fail(dec.message());
      // Without a cache a decode step at context c recomputes all c + 1 tokens:
      // the work (and the time) of a prefill of c + 1 tokens.
      std::vector<double> re;
      for (int64_t i = 0; i < reps; ++i) {
        auto s = time_prefill(eng, ctx_tokens);
        if (!s.ok()) return fail(s.message());
        re.push_back(*s * 1e3);
      }
      rows.push_back({c, *dec * 1e3 / kSweepDecodeSteps, summarize(re).median});
    }
  }

  char hash_hex[19];
  std::snprintf(hash_hex, sizeof hash_hex, "0x%016" PRIx64, tg_hash);
  if (o.json) {
    nlohmann::json j;
    j["model"] = o.model;
    j["arch"] = info.architecture;
    j["threads"] = threads;
    j["isa"] = info.isa;
    j["kv_dtype"] = kv_dtype_name(o.kv_dtype);
    j["reps"] = o.reps;
    j["pp_tokens"] = o.pp;
    j["tg_tokens"] = o.tg;
    j["pp_tokens_per_s"] = pp.median;
    j["pp_tokens_per_s_min"] = pp.min;
    j["pp_tokens_per_s_max"] = pp.max;
    j["tg_tokens_per_s"] = tg.median;
    j["tg_tokens_per_s_min"] = tg.min;
    j["tg_tokens_per_s_max"] = tg.max;
    j["weight_bytes_per_token"] = info.weight_bytes_per_token;
    j["tg_gb_per_s"] = tg_gbs;
    j["peak_read_gb_per_s"] = kPeakReadGBs;
    j["tg_fraction_of_peak"] = tg_gbs / kPeakReadGBs;
    j["tg_tokens_hash"] = hash_hex;
    j["tg_tokens_consistent"] = tg_consistent;
    if (!rows.empty()) {
      j["ctx_sweep"] = nlohmann::json::array();
      for (const SweepRow& r : rows) {
        j["ctx_sweep"].push_back({{"context", r.ctx},
                                  {"cached_ms_per_step", r.cached_ms},
                                  {"recompute_ms_per_step", r.recompute_ms}});
      }
    }
    std::printf("%s\n", j.dump().c_str());
    return tg_consistent ? 0 : 1;
  }

  std::printf("model: %s (%s, %d layers, embd %d, vocab %d)\n", o.model.c_str(), info.architecture.c_str(),
              info.n_layers, info.n_embd, info.vocab_size);
  std::printf("threads: %d, isa: %s, kv: %s, block size %" PRId64 ", %" PRId64 " reps + 1 warm-up\n\n", threads,
              info.isa, kv_dtype_name(o.kv_dtype), o.block_size, o.reps);
  std::printf("| test     | tokens/s (median) |      min |      max |\n");
  std::printf("|----------|-------------------|----------|----------|\n");
  if (o.pp > 0) {
    std::printf("| pp%-6" PRId64 " | %17.1f | %8.1f | %8.1f |\n", o.pp, pp.median, pp.min, pp.max);
  }
  if (o.tg > 0) {
    std::printf("| tg%-6" PRId64 " | %17.1f | %8.1f | %8.1f |\n", o.tg, tg.median, tg.min, tg.max);
    std::printf("\ntg: %.1f MB of weights read per token -> %.2f GB/s, %.0f%% of the %.0f GB/s peak\n",
                bytes_per_token / 1e6, tg_gbs, 100.0 * tg_gbs / kPeakReadGBs, kPeakReadGBs);
    std::printf("tg tokens hash: %s%s\n", hash_hex, tg_consistent ? "" : " (DIFFERED between repetitions!)");
  }
  if (!rows.empty()) {
    std::printf("\nKV cache vs recompute (ms per decode step)\n");
    std::printf("| context | with KV cache | recompute | speedup |\n");
    std::printf("|---------|---------------|-----------|---------|\n");
    for (const SweepRow& r : rows) {
      std::printf("| %7" PRId64 " | %13.2f | %9.2f | %6.1fx |\n", r.ctx, r.cached_ms, r.recompute_ms,
                  r.recompute_ms / r.cached_ms);
    }
  }
  return tg_consistent ? 0 : 1;
}

const Register kRegisterBench("bench", "prefill/decode throughput (pp/tg, llama-bench style), --ctx-sweep", run_bench);

}  // namespace
}  // namespace pagoda::cli
