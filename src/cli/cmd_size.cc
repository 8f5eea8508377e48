// `pagoda size`: KV cache sizing and capacity planning for a model on a device
// (or on a given KV budget). All arithmetic lives in kv/sizing.h and sim/planner.h.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/cli_util.h"
#include "cli/command.h"
#include "cli/engine_flags.h"
#include "cli/plan_flags.h"
#include "sim/hardware.h"
#include "sim/model_desc.h"  // and kv/sizing.h, the kv:: sizing arithmetic below
#include "sim/planner.h"

namespace pagoda::cli {
namespace {

const char* kHelp = R"(usage: pagoda size --model M [options]

KV cache bytes per token / request / block and, given a device, how many requests
and how much context fit after the weights.

  --model M               preset name (see --list), config.json, or .gguf file (default: the default model)
  --gpu G                 device from data/hardware.json (see --list)
  --gpu-mem BYTES         device memory instead of (or overriding) --gpu, e.g. 80GiB
  --tp N                  tensor parallel degree (default 1)
  --kv-dtype T            f32|f16|bf16|fp8|int8|q8_0|q4_0|q4_1|iq4_nl|q5_0|q5_1, or K/V as
                          q8_0/q4_0 (default bf16; f16 for a .gguf); -ctk / -ctv set K's / V's
  --weights-dtype T       f32|bf16|fp16|fp8|int8|q8_0|q4 (default bf16; a .gguf: the file's bytes)
  --context L             tokens per request (default min(8192, model max))
  --concurrency C         concurrent requests (default 1)
  --utilization U         fraction of device memory the engine may use (default 0.9)
  --block-size B          tokens per KV block (default 16)
  --kv-cache-memory BYTES a given KV budget per device instead of deriving it from a GPU:
                          reports blocks = floor(budget / bytes per block) and the max
                          full-context concurrency = floor((blocks - 1 - watermark) / blocks per request)
  --watermark F           admission watermark: floor(F x (blocks - 1)) blocks kept free (default 0.01)
  --table                 print the context x concurrency fit table (on by default with a device)
  --json                  one JSON object instead of text
  --disable-hybrid-kv-cache-manager   size one full-context KV group (as the engine with that flag)

Hybrid models (lfm2, qwen35 GGUF files): K/V per token counts the attention layers only;
each sequence also holds its recurrent state (fixed bytes, whatever its length) in blocks
of the same pool, packed as the engine packs them (kv::plan_pool, the engine's arithmetic).
  --plot out.svg          SVG: KV memory per GPU vs concurrent requests for several contexts
  --list                  list model presets and devices
)";

int fail(const std::string& msg) {
  std::fprintf(stderr, "pagoda size: %s\n", msg.c_str());
  return 2;
}

int run_size(int argc, char** argv) {
  Args args(argc, argv);
  if (args.help()) return print_usage(kHelp);
  if (args.flag("--list")) {
    std::printf("model presets:\n");
    for (const auto& n : sim::list_model_presets()) std::printf("  %s\n", n.c_str());
    std::printf("devices:\n");
    for (const auto& n : sim::list_hardware()) std::printf("  %s\n", n.c_str());
    std::printf("(data directory: %s)\n", sim::data_dir().c_str());
    return 0;
  }
  std::string model_spec = default_model_path(), gpu, gpu_mem, v;
  args.value("--model", &model_spec, "-m");
  const bool json = args.flag("--json");
  const bool want_table = args.flag("--table");
  std::string plot_path;
  args.value("--plot", &plot_path);

  auto model = sim::resolve_model(model_spec);
  if (!model.ok()) return fail(model.message());
  const bool is_gguf = model->source.rfind("gguf:", 0) == 0;

  sim::PlanInput in;
  in.model = *model;
  in.hybrid_kv = !args.flag("--disable-hybrid-kv-cache-manager");
  in.context = std::min<int64_t>(8192, in.model.max_context);
  in.kv_dtype = is_gguf ? kv::kv_dtype_f16() : kv::kv_dtype_bf16();
  in.weights_from_file = is_gguf;

  if (args.value("--gpu", &gpu)) {
    auto hw = sim::load_hardware(gpu);
    if (!hw.ok()) return fail(hw.message());
    in.hw = *hw;
  }
  if (args.value("--gpu-mem", &gpu_mem)) {
    auto b = sim::parse_bytes(gpu_mem);
    if (!b.ok()) return fail("--gpu-mem: " + b.message());
    if (gpu.empty()) in.hw = sim::generic_device(*b);
    else in.hw.memory_bytes = *b;
  }
  // A given KV budget: the engine's pool arithmetic (kv/sizing.h), reported by the planner:
  //   blocks          = floor(budget / bytes per block)            kv::num_blocks_for_budget
  //   watermark       = floor(watermark x (blocks - 1))            kv::watermark_blocks
  //   max concurrency = floor((blocks - 1 null block - watermark)
  //                           / ceil(context / block size))        kv::max_concurrency
  if (std::string err = parse_plan_dtype_flags(args, &in); !err.empty()) return fail(err);
  int64_t i = 0;
  if (args.value("--tp", &v)) {
    if (!parse_int(v, 1, 1024, &i)) return fail("--tp: expected an integer in [1, 1024], got '" + v + "'");
    in.tp = static_cast<int32_t>(i);
  }
  if (args.value("--context", &v, "-c")) {
    if (!parse_int(v, 1, int64_t{1} << 40, &in.context)) return fail("--context: expected a positive integer, got '" + v + "'");
  }
  if (args.value("--concurrency", &v)) {
    if (!parse_int(v, 1, int64_t{1} << 30, &in.concurrency)) return fail("--concurrency: expected a positive integer, got '" + v + "'");
  }
  if (args.value("--utilization", &v) && !parse_f64(v, &in.utilization)) return fail("--utilization: expected a number");
  if (args.value("--watermark", &v) && !parse_f64(v, &in.watermark)) return fail("--watermark: expected a number");
  if (args.value("--block-size", &v)) {
    if (!parse_int(v, 1, 1 << 20, &i)) return fail("--block-size: expected a positive integer, got '" + v + "'");
    in.block_size = static_cast<int32_t>(i);
  }
  if (std::string left = args.leftover(); !left.empty()) return fail(left + " (see pagoda size --help)");

  const bool have_budget = in.hw.memory_bytes > 0 || in.kv_cache_memory > 0;
  if (!have_budget) {
    // Sizing only: no device, no budget.
    const kv::KvShape shape = in.model.kv_shape();
    const kv::KvShape rank = kv::shard_for_tp(shape, in.tp);
    if (Status s = kv::validate_kv_shape(shape); !s.ok()) return fail(s.message());
    if (auto st = in.model.state_on_rank(in.tp); !st.ok()) return fail("--tp " + std::to_string(in.tp) + ": " + st.message());
    const uint64_t state_bytes = sim::rank_state(in).bytes();  // one rank's share
    const uint64_t per_token = kv::kv_bytes_per_token(shape, in.kv_dtype);
    const uint64_t per_token_gpu = kv::kv_bytes_per_token(rank, in.kv_dtype);
    const uint64_t per_req = sim::request_bytes(in, in.context);  // K/V + a hybrid model's recurrent state
    const uint64_t per_block = kv::kv_bytes_per_block(rank, in.kv_dtype, in.block_size);
    // Hybrid models: the state's blocks as the engine's pool packs them (kv::plan_pool_layout).
    const int32_t rec = in.model.num_recurrent_layers();
    auto layout = kv::plan_pool_layout(sim::pool_request(in, 0));
    if (!layout.ok()) return fail(layout.message());
    const int32_t state_blocks = layout->layout.state_blocks;
    if (json) {
      nlohmann::json j = {{"model", in.model.name}, {"kv_dtype", kv::kv_dtype_label(in.kv_dtype)}, {"tp", in.tp},
                          {"context", in.context}, {"kv_bytes_per_token", per_token},
                          {"kv_bytes_per_token_per_gpu", per_token_gpu}, {"kv_bytes_per_request", per_req},
                          {"kv_bytes_per_block", per_block}, {"recurrent_layers", rec},
                          {"state_bytes_per_sequence", state_bytes},
                          {"state_blocks_per_sequence", state_blocks}};
      std::printf("%s\n", j.dump(2).c_str());
    } else {
      std::printf("model               %s (%s)\n", in.model.name.c_str(), in.model.source.c_str());
      std::printf("KV dtype            %s\n", kv::kv_dtype_label(in.kv_dtype).c_str());
      std::printf("KV bytes per token  %llu (%d layers x %llu per layer)\n", static_cast<unsigned long long>(per_token),
                  shape.num_layers, static_cast<unsigned long long>(kv::kv_bytes_per_token_per_layer(shape, in.kv_dtype)));
      if (in.tp > 1) std::printf("  per GPU (tp %d)    %llu\n", in.tp, static_cast<unsigned long long>(per_token_gpu));
      if (rec > 0)
        std::printf("recurrent state     %llu bytes per sequence (%d recurrent layers, no K/V), in %d KV blocks\n",
                    static_cast<unsigned long long>(state_bytes), rec, state_blocks);
      std::printf("KV per request      %llu bytes = %s at %lld tokens\n", static_cast<unsigned long long>(per_req),
                  sim::format_bytes(static_cast<double>(per_req)).c_str(), static_cast<long long>(in.context));
      std::printf("KV per block        %llu bytes (%d tokens)\n", static_cast<unsigned long long>(per_block), in.block_size);
      if (shape.num_layers == 0 && rec > 0)  // attention-free (mamba2): the token group's slot holds state rows only
        std::printf("pool block          %llu bytes (no attention layer: one K/V slot a state row wide, state rows only)\n",
                    static_cast<unsigned long long>(layout->block_bytes));
      std::printf("\n(give --gpu, --gpu-mem or --kv-cache-memory for a capacity plan)\n");
    }
    return 0;
  }

  if (Status s = sim::validate_plan_input(in); !s.ok()) return fail(s.message());
  const sim::PlanReport r = sim::plan_capacity(in);
  const bool table_on = want_table || in.kv_cache_memory == 0;
  const sim::FitTable table =
      sim::fit_table(in, sim::default_table_contexts(), sim::default_table_concurrencies());
  if (json) {
    std::printf("%s\n", sim::plan_to_json(in, r, table_on ? &table : nullptr).c_str());
  } else {
    std::printf("%s", sim::format_report(in, r).c_str());
    if (table_on) std::printf("\n%s", sim::format_fit_table(table).c_str());
  }
  if (!plot_path.empty()) {
    std::vector<int64_t> contexts;
    for (int64_t L : {int64_t{4096}, int64_t{8192}, int64_t{32768}, int64_t{131072}}) {
      if (L <= in.model.max_context) contexts.push_back(L);
    }
    if (std::find(contexts.begin(), contexts.end(), in.context) == contexts.end()) {
      contexts.push_back(in.context);
      std::sort(contexts.begin(), contexts.end());
    }
    // x range: a bit past where the shortest context fills the budget, at least the target.
    sim::PlanInput shortest = in;
    shortest.context = contexts.front();
    const int64_t c_max = std::max<int64_t>(in.concurrency, sim::plan_capacity(shortest).max_concurrency * 5 / 4);
    const std::string svg = sim::kv_memory_plot_svg(in, contexts, std::clamp<int64_t>(c_max, 8, 4096));
    std::ofstream out(plot_path, std::ios::binary);
    if (!out || !(out << svg)) return fail("cannot write " + plot_path);
    if (!json) std::printf("\nwrote %s\n", plot_path.c_str());
  }
  return 0;
}

Register reg("size", "KV cache sizing and capacity planning (bytes per token, fits on a GPU?)", run_size);

}  // namespace
}  // namespace pagoda::cli
