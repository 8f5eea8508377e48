// pagoda bench: llama-bench style single-sequence throughput.
//   pp: prefill `pp` random tokens (seeded) in one forward pass.
//   tg: after a short prompt, decode `tg` tokens one at a time (greedy, so the
//       generated ids are hashed and a faster run that changed the answer shows).
// One warm-up, then `-r` repetitions: median, min and max tokens/s, and the
// achieved weight-read bandwidth of decode against the machine's peak.
// --ctx-sweep: ms per decode step at several contexts, with the KV cache and
// with full recomputation (the "KV cache vs recompute" table).
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
#include "base/rng.h"
#include "base/timer.h"
#include "cli/bench_serving.h"
#include "cli/command.h"
#include "cli/engine_flags.h"
#include "kernels/api.h"
#include "model/model.h"
#include "runtime/model_runner.h"
#include "runtime/sequence.h"
#include "sample/sampler.h"

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
  kernels::KvDtype kv_dtype = kernels::KvDtype::F16;
  bool json = false, ctx_sweep = false;
};

bool parse_i64(const char* s, int64_t* out) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s, &end, 10);
  if (errno || end == s || *end) return false;
  *out = v;
  return true;
}

std::string parse_args(int argc, char** argv, BenchOptions* o, bool* help) {
  std::string k_name, v_name;  // llama-bench's -ctk / -ctv
  bool have_k = false, have_v = false;
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
    } else if (a == "--kv-dtype" || a == "--kv-cache-dtype") {
      ok = parse_kv_dtype_name(v, &o->kv_dtype);
    } else if (a == "-ctk" || a == "--cache-type-k") {
      k_name = v;
      have_k = true;
    } else if (a == "-ctv" || a == "--cache-type-v") {
      v_name = v;
      have_v = true;
    } else {
      return "unknown option " + a;
    }
    if (!ok) return "bad value '" + std::string(v) + "' for " + a;
  }
  if (have_k || have_v) {
    const std::string err =
        kv_dtype_from_ctk_ctv(have_k ? &k_name : nullptr, have_v ? &v_name : nullptr, &o->kv_dtype);
    if (!err.empty()) return err;
  }
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

// Prefill of `tokens` into a fresh sequence; returns seconds.
Expected<double> time_prefill(runtime::SequenceSession& seq, const std::vector<int32_t>& tokens) {
  seq.reset();
  Timer t;
  PAGODA_TRY(seq.feed(tokens));
  return t.seconds();
}

// Greedy decode of n tokens after `prompt`; returns the decode seconds (prompt excluded).
Expected<double> time_decode(runtime::SequenceSession& seq, const std::vector<int32_t>& prompt, int64_t n,
                             std::vector<int32_t>* out) {
  seq.reset();
  out->clear();
  PAGODA_ASSIGN_OR_RETURN(std::span<const float> logits, seq.feed(prompt));
  double s = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t t = sample::argmax(logits);
    out->push_back(t);
    Timer step;
    PAGODA_ASSIGN_OR_RETURN(logits, seq.feed(std::span<const int32_t>(&t, 1)));
    s += step.seconds();
  }
  return s;
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
  if (help) {
    std::fputs(kBenchUsage, stdout);
    return 0;
  }
  if (!perr.empty()) {
    std::fprintf(stderr, "pagoda bench: %s\n\n%s", perr.c_str(), kBenchUsage);
    return 2;
  }
  if (o.model.empty()) o.model = default_model_path();
  const int threads = o.threads > 0 ? static_cast<int>(o.threads)
                                    : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  kernels::set_num_threads(threads);

  auto model = model::Model::load(o.model);
  if (!model.ok()) return fail(o.model + ": " + model.message());
  const model::ModelConfig& cfg = (*model)->config();
  int64_t need_ctx = std::max<int64_t>(o.pp, kTgPromptTokens + o.tg);
  std::vector<int64_t> sweep;
  if (o.ctx_sweep) {
    for (int64_t c : kSweepContexts) {
      if (c + kSweepDecodeSteps + 1 <= cfg.n_ctx_train) sweep.push_back(c);
    }
    if (!sweep.empty()) need_ctx = std::max(need_ctx, sweep.back() + kSweepDecodeSteps + 1);
  }
  if (need_ctx > cfg.n_ctx_train) {
    return fail("the test needs " + std::to_string(need_ctx) + " tokens of context, the model has " +
                std::to_string(cfg.n_ctx_train));
  }
  runtime::RunnerOptions ro;
  ro.block_size = static_cast<int32_t>(o.block_size);
  ro.num_blocks = runtime::blocks_for_context(need_ctx, ro.block_size);
  ro.kv_dtype = o.kv_dtype;
  ro.max_tokens_per_step = static_cast<int32_t>(need_ctx);  // every prefill is one pass
  auto runner = runtime::ModelRunner::create(**model, ro);
  if (!runner.ok()) return fail(runner.message());
  runtime::SequenceSession seq(**runner);

  // Separate streams so the tg prompt (and its hash) does not depend on --pp.
  Rng rng(static_cast<uint64_t>(o.seed));
  Rng tg_rng(static_cast<uint64_t>(o.seed) ^ 0x7467ull);
  const std::vector<int32_t> pp_tokens = random_tokens(rng, o.pp, cfg.n_vocab);
  const std::vector<int32_t> tg_prompt = random_tokens(tg_rng, kTgPromptTokens, cfg.n_vocab);
  std::vector<double> pp_tps, tg_tps;
  std::vector<int32_t> generated;
  uint64_t tg_hash = 0;
  bool tg_consistent = true;
  for (int64_t r = -1; r < o.reps; ++r) {  // r == -1: warm-up
    if (o.pp > 0) {
      auto s = time_prefill(seq, pp_tokens);
      if (!s.ok()) return fail(s.message());
      if (r >= 0) pp_tps.push_back(static_cast<double>(o.pp) / *s);
    }
    if (o.tg > 0) {
      auto s = time_decode(seq, tg_prompt, o.tg, &generated);
      if (!s.ok()) return fail(s.message());
      const uint64_t h = xxh3_64(generated.data(), generated.size() * sizeof(int32_t));
      if (r == -1) tg_hash = h;
      tg_consistent = tg_consistent && h == tg_hash;
      if (r >= 0) tg_tps.push_back(static_cast<double>(o.tg) / *s);
    }
  }
  const Stats pp = summarize(pp_tps), tg = summarize(tg_tps);
  const double bytes_per_token = static_cast<double>((*model)->weight_bytes_per_token());
  const double tg_gbs = tg.median * bytes_per_token / 1e9;

  struct SweepRow {
    int64_t ctx;
    double cached_ms, recompute_ms;
  };
  std::vector<SweepRow> rows;
  if (!sweep.empty()) {
    runtime::SequenceSession recompute(**runner, /*recompute=*/true);
    const int64_t reps = std::min<int64_t>(o.reps, 2);
    for (int64_t c : sweep) {
      const std::vector<int32_t> ctx_tokens = random_tokens(rng, c + 1, cfg.n_vocab);
      const std::vector<int32_t> prefix(ctx_tokens.begin(), ctx_tokens.end() - 1);
      auto dec = time_decode(seq, prefix, kSweepDecodeSteps, &generated);
      if (!dec.ok()) return fail(dec.message());
      // Without a cache a decode step at context c recomputes all c + 1 tokens.
      std::vector<double> re;
      for (int64_t i = 0; i < reps; ++i) {
        auto s = time_prefill(recompute, ctx_tokens);
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
    j["arch"] = cfg.arch;
    j["threads"] = threads;
    j["isa"] = kernels::cpu::isa_name();
    j["kv_dtype"] = kernels::kv_dtype_name(o.kv_dtype);
    j["reps"] = o.reps;
    j["pp_tokens"] = o.pp;
    j["tg_tokens"] = o.tg;
    j["pp_tokens_per_s"] = pp.median;
    j["pp_tokens_per_s_min"] = pp.min;
    j["pp_tokens_per_s_max"] = pp.max;
    j["tg_tokens_per_s"] = tg.median;
    j["tg_tokens_per_s_min"] = tg.min;
    j["tg_tokens_per_s_max"] = tg.max;
    j["weight_bytes_per_token"] = (*model)->weight_bytes_per_token();
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

  std::printf("model: %s (%s, %d layers, embd %d, vocab %d)\n", o.model.c_str(), cfg.arch.c_str(),
              cfg.n_layers, cfg.n_embd, cfg.n_vocab);
  std::printf("threads: %d, isa: %s, kv: %s, block size %" PRId64 ", %" PRId64 " reps + 1 warm-up\n\n", threads,
              kernels::cpu::isa_name(), kernels::kv_dtype_name(o.kv_dtype), o.block_size, o.reps);
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
