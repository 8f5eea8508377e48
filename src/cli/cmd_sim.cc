// `pagoda sim`: run a workload through the real scheduler and KV manager with a
// roofline cost model of a device (sim/simulator.h), and print serving metrics.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <type_traits>

#include "cli/cli_util.h"
#include "cli/command.h"
#include "cli/engine_flags.h"
#include "cli/plan_flags.h"
#include "cli/run_report.h"
#include "cli/sim_calibrate.h"
#include "gguf/gguf.h"
#include "loadgen/workload.h"
#include "sim/hardware.h"
#include "sim/model_desc.h"  // and kv/sizing.h, the kv:: sizing arithmetic below
#include "sim/simulator.h"
#include "sim/workload.h"
#include "tok/tokenizer.h"

namespace pagoda::cli {
namespace {

const char* kHelp = R"(usage: pagoda sim --model M --gpu G [options]
       pagoda sim --calibrate [-m MODEL] [-t THREADS] [--out data/hardware.json]

Simulates serving a workload: the real scheduler and KV manager run step by step,
each step costs max(compute, memory) + overhead on the device (roofline model,
data/hardware.json). Prints the serving metrics `pagoda bench` prints.

  --model M                  preset, config.json or .gguf (default: the default model)
  --gpu G                    device from data/hardware.json (default: cpu-local)
  --gpu-mem BYTES            override the device memory
  --tp N                     tensor parallel degree (default 1)
  --kv-dtype T               f32|f16|bf16|fp8|int8|q8_0|q4_0|q4_1|iq4_nl|q5_0|q5_1, or K/V as
                              q8_0/q4_0 (default bf16; f16 for a .gguf); -ctk / -ctv set K's / V's
  --weights-dtype T          f32|bf16|fp16|fp8|int8|q8_0|q4 (default bf16; a .gguf: the file's bytes)
  --utilization U            fraction of device memory (default 0.9)
  --kv-cache-memory BYTES    a given KV budget per device instead
  --num-kv-blocks N          the KV pool in blocks, null block included (as the engine's flag)
  --block-size B             tokens per KV block (default 16)
  --watermark F              fraction of blocks admission keeps free (default 0.01)
  --workload W               random | shared-prefix | trace.jsonl (default random)
  --request-rate R           requests/s, Poisson arrivals (default inf: all at t = 0)
  --num-prompts N            requests (random, shared-prefix; default 100)
  --input-len L              prompt tokens (default 512)
  --output-len L             generated tokens (default 128)
  --range-ratio F            lengths uniform in [L(1-F), L(1+F)] (default 0)
  --prefix-len L             shared-prefix: shared tokens (default input-len / 2)
  --num-prefixes N           shared-prefix: distinct prefixes (default 1)
  --num-groups G --prompts-per-group R --suffix-len Q
                             shared-prefix as `pagoda bench` builds it: G prefixes of --prefix-len
                             tokens x R suffixes of Q tokens, shuffled (implies --bench-workload)
  --bench-workload           build random/shared-prefix requests with `pagoda bench`'s generators
                             (same seed -> the same lengths, groups, order and arrivals)
  --seed S                   workload seed (default 0)
  --max-concurrency C        a client keeping at most C requests in flight, as `pagoda bench
                             --max-concurrency` (TTFT counts from submission; default: no limit)
  --max-num-seqs N           scheduler cap on running requests (default 256)
  --max-num-batched-tokens N token budget per step (default 8192)
  --no-prefix-caching        disable automatic prefix caching
  --state-checkpoint-interval K  hybrid models (lfm2, qwen35): a copy of the recurrent state every K
                             blocks, as the engine's flag (default 4; 0: none, and no prefix caching)
  --disable-hybrid-kv-cache-manager   one full-context KV group (window layers hold every token)
  --schedule-policy fcfs|lpm admission order: arrival, or longest cached prefix first (default fcfs)
  --json                     metrics as JSON
  --plot out.svg             KV usage and running requests over time
  --report out.html          the run's time series as a self-contained HTML report (the dashboard's charts)

To match an offline `pagoda bench` run, give the engine's defaults explicitly:
--kv-cache-memory 256MiB (or --num-kv-blocks N) --max-num-seqs 64 --max-num-batched-tokens 2048.

--calibrate times real engine steps on this machine and fits the device's
efficiencies and step overhead (see pagoda sim --calibrate --help).
)";

int fail(const std::string& msg) {
  std::fprintf(stderr, "pagoda sim: %s\n", msg.c_str());
  return 2;
}

// `pagoda bench`'s requests for the same flags, as SimRequests: the token space of
// the GGUF's own tokenizer when there is one (then the ids are the bench's too),
// else ids 1..vocab-1 without BOS.
struct BenchShape {
  bool shared_prefix = false;
  int num_groups = 4, prompts_per_group = 8, suffix_len = 32;
};

Expected<std::vector<sim::SimRequest>> bench_requests(const std::string& gguf_path, const sim::WorkloadSpec& ws,
                                                      const BenchShape& b) {
  loadgen::TokenSpace space;
  if (!gguf_path.empty()) {
    auto f = gguf::GgufFile::open(gguf_path);
    if (!f.ok()) return f.error();
    auto tk = tok::Tokenizer::from_gguf(**f);
    if (!tk.ok()) return errorf("tokenizer of %s: %s", gguf_path.c_str(), tk.message().c_str());
    space = loadgen::token_space(**tk);
  } else {
    for (int32_t id = 1; id < std::max(2, ws.vocab); ++id) space.ordinary.push_back(id);
  }
  if (space.ordinary.empty()) return errorf("the vocabulary has no ordinary tokens to build prompts from");
  const int prefix_len = ws.prefix_len > 0 ? ws.prefix_len : 256;
  const std::vector<loadgen::BenchRequest> br =
      b.shared_prefix ? loadgen::make_shared_prefix_workload(space, b.num_groups, b.prompts_per_group, prefix_len,
                                                           b.suffix_len, ws.output_len, ws.seed)
                      : loadgen::make_random_workload(space, ws.num_prompts, ws.input_len, ws.output_len,
                                                    ws.range_ratio, ws.seed);
  const std::vector<double> at = loadgen::arrival_times(static_cast<int>(br.size()), ws.request_rate, ws.seed);
  std::vector<sim::SimRequest> out(br.size());
  for (size_t k = 0; k < br.size(); ++k) {
    out[k].arrival_s = at[k];
    out[k].prompt = br[k].prompt;
    out[k].output_len = br[k].max_tokens;
  }
  return out;
}

int run_sim(int argc, char** argv) {
  Args args(argc, argv);
  if (Args probe = args; probe.flag("--calibrate")) return sim_calibrate_main(argc, argv);  // or PAGODA_CALIBRATE=1
  if (args.help()) return print_usage(kHelp);
  std::string model_spec = default_model_path(), gpu = "cpu-local", v, plot_path, workload = "random";
  args.value("--model", &model_spec, "-m");
  args.value("--gpu", &gpu);
  args.value("--plot", &plot_path);
  std::string report_path;
  args.value("--report", &report_path);
  args.value("--workload", &workload);
  const bool json = args.flag("--json");
  const bool no_prefix = args.flag("--no-prefix-caching");
  bool like_bench = args.flag("--bench-workload");

  auto model = sim::resolve_model(model_spec);
  if (!model.ok()) return fail(model.message());
  auto hw = sim::load_hardware(gpu);
  if (!hw.ok()) return fail(hw.message());
  const bool is_gguf = model->source.rfind("gguf:", 0) == 0;

  sim::SimConfig cfg;
  sim::PlanInput& in = cfg.plan;
  in.hybrid_kv = !args.flag("--disable-hybrid-kv-cache-manager");
  in.model = *model;
  in.hw = *hw;
  in.kv_dtype = is_gguf ? kv::kv_dtype_f16() : kv::kv_dtype_bf16();
  in.weights_from_file = is_gguf;
  cfg.enable_prefix_caching = !no_prefix;

  sim::WorkloadSpec ws;
  ws.vocab = in.model.vocab;
  auto kind = sim::parse_workload_kind(workload);
  if (!kind.ok()) return fail(kind.message());
  ws.kind = *kind;
  if (ws.kind == sim::WorkloadKind::kTrace) ws.trace_path = workload;

  int64_t i = 0;
  auto int_flag = [&](const char* name, int64_t lo, int64_t hi, auto* dst) -> bool {
    if (!args.value(name, &v)) return true;
    if (!parse_int(v, lo, hi, &i)) return false;
    *dst = static_cast<std::remove_pointer_t<decltype(dst)>>(i);
    return true;
  };
  if (args.value("--gpu-mem", &v)) {
    auto b = sim::parse_bytes(v);
    if (!b.ok()) return fail("--gpu-mem: " + b.message());
    in.hw.memory_bytes = *b;
  }
  if (std::string err = parse_plan_dtype_flags(args, &in); !err.empty()) return fail(err);
  int32_t num_kv_blocks = 0, max_concurrency = 0;
  BenchShape shape;
  shape.shared_prefix = ws.kind == sim::WorkloadKind::kSharedPrefix;
  const bool bench_flags = [&] {
    Args probe = args;  // peek without consuming
    return probe.value("--num-groups", &v) || probe.value("--prompts-per-group", &v) || probe.value("--suffix-len", &v);
  }();
  if (!int_flag("--tp", 1, 1024, &in.tp)) return fail("--tp: expected an integer in [1, 1024]");
  if (!int_flag("--block-size", 1, 256, &in.block_size)) return fail("--block-size: expected 1..256");
  if (!int_flag("--num-kv-blocks", 2, 1 << 30, &num_kv_blocks)) return fail("--num-kv-blocks: expected an integer >= 2");
  if (!int_flag("--max-concurrency", 1, 1 << 24, &max_concurrency)) return fail("--max-concurrency: expected a positive integer");
  if (!int_flag("--num-prompts", 1, 10000000, &ws.num_prompts)) return fail("--num-prompts: expected a positive integer");
  if (!int_flag("--input-len", 1, 1 << 24, &ws.input_len)) return fail("--input-len: expected a positive integer");
  if (!int_flag("--output-len", 1, 1 << 24, &ws.output_len)) return fail("--output-len: expected a positive integer");
  if (!int_flag("--prefix-len", 0, 1 << 24, &ws.prefix_len)) return fail("--prefix-len: expected an integer >= 0");
  if (!int_flag("--num-prefixes", 1, 1 << 20, &ws.num_prefixes)) return fail("--num-prefixes: expected a positive integer");
  if (!int_flag("--num-groups", 1, 100000, &shape.num_groups)) return fail("--num-groups: expected a positive integer");
  if (!int_flag("--prompts-per-group", 1, 100000, &shape.prompts_per_group)) return fail("--prompts-per-group: expected a positive integer");
  if (!int_flag("--suffix-len", 0, 1 << 24, &shape.suffix_len)) return fail("--suffix-len: expected an integer >= 0");
  if (!int_flag("--seed", 0, INT64_MAX, &ws.seed)) return fail("--seed: expected an integer >= 0");
  if (!int_flag("--max-num-seqs", 1, 1 << 20, &cfg.max_num_seqs)) return fail("--max-num-seqs: expected a positive integer");
  if (!int_flag("--state-checkpoint-interval", 0, 1 << 20, &cfg.state_checkpoint_interval))
    return fail("--state-checkpoint-interval: expected an integer in 0..1048576");
  if (!int_flag("--max-num-batched-tokens", 1, 1 << 24, &cfg.max_num_batched_tokens)) {
    return fail("--max-num-batched-tokens: expected a positive integer");
  }
  if (args.value("--schedule-policy", &v)) {
    if (v != "fcfs" && v != "lpm") return fail("--schedule-policy: expected fcfs or lpm");
    cfg.schedule_lpm = v == "lpm";
  }
  if (args.value("--request-rate", &v) && !(v == "inf" || parse_f64(v, &ws.request_rate))) return fail("--request-rate: expected a number or inf");
  if (args.value("--range-ratio", &v) && !parse_f64(v, &ws.range_ratio)) return fail("--range-ratio: expected a number");
  if (args.value("--utilization", &v) && !parse_f64(v, &in.utilization)) return fail("--utilization: expected a number");
  if (args.value("--watermark", &v) && !(parse_f64(v, &in.watermark) && in.watermark >= 0 && in.watermark < 1)) {
    return fail("--watermark: expected a number in [0, 1)");
  }
  if (std::string left = args.leftover(); !left.empty()) return fail(left + " (see pagoda sim --help)");
  if (bench_flags && ws.kind != sim::WorkloadKind::kSharedPrefix) {
    return fail("--num-groups, --prompts-per-group and --suffix-len go with --workload shared-prefix");
  }
  like_bench = like_bench || bench_flags;
  if (like_bench && ws.kind == sim::WorkloadKind::kTrace) return fail("--bench-workload: random or shared-prefix only");
  if (num_kv_blocks > 0) {
    // Exactly the engine's pool: N blocks, whatever the byte budget would give.
    auto layout = kv::plan_pool_layout(sim::pool_request(in, 0));
    if (!layout.ok()) return fail(layout.message());
    in.kv_cache_memory = static_cast<uint64_t>(num_kv_blocks) * layout->block_bytes;
    cfg.max_num_blocks = num_kv_blocks;
  }

  auto reqs = like_bench ? bench_requests(is_gguf ? model_spec : std::string(), ws, shape) : sim::make_workload(ws);
  if (!reqs.ok()) return fail(reqs.message());
  cfg.max_concurrency = max_concurrency;
  auto res = sim::simulate(cfg, *reqs);
  if (!res.ok()) return fail(res.message());
  if (json) {
    std::printf("%s\n", sim::metrics_to_json(res->metrics).c_str());
  } else {
    std::printf("model %s on %s x tp %d, KV %s, %lld KV blocks of %d tokens, %s workload, %zu requests",
                in.model.name.c_str(), in.hw.name.c_str(), in.tp, kv::kv_dtype_label(in.kv_dtype).c_str(),
                static_cast<long long>(res->metrics.num_blocks), in.block_size, workload.c_str(), reqs->size());
    if (max_concurrency > 0) std::printf(", max concurrency %d", max_concurrency);
    if (in.model.state_rows > 0) {
      const sim::PlanReport pr = sim::plan_capacity(in);
      std::printf("\nrecurrent state %llu B per sequence in %d KV blocks (+ %llu K/V bytes per token, %d attention layers)",
                  static_cast<unsigned long long>(pr.state_bytes_per_sequence), pr.state_blocks_per_sequence,
                  static_cast<unsigned long long>(pr.kv_bytes_per_token_per_gpu), in.model.kv_shape().num_layers);
    }
    std::printf("\n%s", sim::format_metrics(res->metrics).c_str());
  }
  if (!report_path.empty()) {
    // One point per step (RunRecorder::write thins a long run).
    RunRecorder rec;
    const int64_t usable = std::max<int64_t>(1, res->metrics.num_blocks - 1);
    for (const sim::SimTracePoint& tp : res->trace) {
      server::SeriesPoint p;
      p.t = tp.t_s;
      p.blocks_total = usable;
      p.blocks_used = std::llround(tp.kv_usage * static_cast<double>(usable));
      p.running = tp.running;
      p.waiting = tp.waiting;
      p.prefix_queries = tp.prefix_query_tokens;
      p.prefix_hits = tp.prefix_hit_tokens;
      p.preemptions = tp.preemptions;
      p.generation_tokens = tp.output_tokens;
      p.prompt_tokens = tp.prompt_tokens;
      rec.add(p);
    }
    const Status w = rec.write(report_path, "sim " + in.model.name + " on " + in.hw.name + " · " + workload,
                               sim::metrics_to_json(res->metrics));
    if (!w.ok()) return fail(w.message());
    if (!json) std::printf("wrote %s\n", report_path.c_str());
  }
  if (!plot_path.empty()) {
    std::ofstream out(plot_path, std::ios::binary);
    if (!out || !(out << sim::sim_plot_svg(cfg, *res))) return fail("cannot write " + plot_path);
    if (!json) std::printf("wrote %s\n", plot_path.c_str());
  }
  return 0;
}

Register reg("sim", "simulate serving a workload on a device (real scheduler + roofline cost model)", run_sim);

}  // namespace
}  // namespace pagoda::cli
