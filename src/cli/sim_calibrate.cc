#include "cli/sim_calibrate.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "base/rng.h"
#include "cli/cli_util.h"
#include "cli/command.h"
#include "cli/engine_flags.h"
#include "engine/engine.h"
#include "loadgen/driver.h"
#include "sim/calibrate.h"
#include "sim/hardware.h"
#include "sim/model_desc.h"

namespace pagoda::cli {
namespace {

const char* kHelp = R"(usage: pagoda sim --calibrate [options]

Times real engine steps of the model on this machine and fits the device entry's
compute, attention and bandwidth efficiencies and per-step overhead by least
squares on the simulator's own step cost (max(compute, memory) + attention +
overhead), then writes
them into the entry's "efficiency" object of hardware.json. The entry's peak
FLOP/s and bandwidth stay as they are: the efficiencies are relative to them.

  -m, --model PATH          GGUF model (default: the default model)
  -t, --threads N           compute threads (default 2)
  --gpu NAME                hardware.json entry to fit (default cpu-local)
  --out PATH                file to update (default: <data dir>/hardware.json)
  --no-save                 print the fit, write nothing
  --prefill-lens A,B,..     one-request prefills, tokens (default 32,64,128,256)
  --decode-batches A,B,..   decode batch sizes (default 1,4,16,32)
  --decode-ctx A,B,..       prompt tokens of the decoding requests; every batch size is
                            timed at every context; two or more contexts tell the
                            attention efficiency apart (default 32,256)
  --decode-steps N          timed decode steps per batch size (default 8)
  --repeats N               passes over the whole set; each step's median is kept (default 3)
  --seed S                  seed of the random prompt ids (default 0)
)";

int fail(const std::string& msg) {
  std::fprintf(stderr, "pagoda sim --calibrate: %s\n", msg.c_str());
  return 2;
}

bool to_int_list(const std::string& s, int64_t lo, int64_t hi, std::vector<int>* out) {
  out->clear();
  size_t i = 0;
  while (i <= s.size()) {
    const size_t j = std::min(s.find(',', i), s.size());
    int64_t v = 0;
    if (!parse_int(s.substr(i, j - i), lo, hi, &v)) return false;
    out->push_back(static_cast<int>(v));
    i = j + 1;
  }
  return !out->empty();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0.0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Plan {
  std::vector<int> prefill_lens{32, 64, 128, 256};
  std::vector<int> decode_batches{1, 4, 16, 32};
  std::vector<int> decode_ctx{32, 256};
  int decode_steps = 8;
  int repeats = 3;
};

// Times steps of one engine through the load driver (loadgen/driver.h); each prompt
// is fresh random ids, so no prefix-cache hit.
class Measurer {
 public:
  Measurer(engine::Engine& eng, const sim::PlanInput& p, uint64_t seed) : drv_(eng), p_(p), rng_(seed) {}

  Status prefill(int n, std::vector<sim::CalibrationSample>* out) {
    PAGODA_ASSIGN_OR_RETURN(engine::RequestId id, drv_.submit(params(n, 1)));
    const loadgen::Step& st = drv_.step();
    const bool done = std::any_of(st.finished.begin(), st.finished.end(),
                                  [&](const loadgen::Stream& s) { return s.id == id; });
    if (!done || drv_.has_unfinished()) return errorf("a %d-token prefill did not finish in one step", n);
    out->push_back({"prefill 1 x " + std::to_string(n), sim::work_of(p_, {{0, n}}), st.seconds()});
    return Status::Ok();
  }

  // `batch` requests of `ctx` prompt tokens: the step that prefills them all is one
  // sample, the median of `steps` decode steps after it another.
  Status decode(int batch, int ctx, int steps, std::vector<sim::CalibrationSample>* out) {
    std::vector<engine::RequestId> ids;
    for (int b = 0; b < batch; ++b) {
      PAGODA_ASSIGN_OR_RETURN(engine::RequestId id, drv_.submit(params(ctx, steps + 2)));
      ids.push_back(id);
    }
    const loadgen::Step& first = drv_.step();
    if (static_cast<int>(first.events.size()) != batch) {
      abort_all(ids);
      return errorf("the %d x %d-token prefill took more than one step (raise --max-num-batched-tokens)", batch, ctx);
    }
    out->push_back({"prefill " + std::to_string(batch) + " x " + std::to_string(ctx),
                    sim::work_of(p_, std::vector<sim::SeqSlice>(static_cast<size_t>(batch), {0, ctx})),
                    first.seconds()});
    std::vector<double> t;
    for (int s = 0; s < steps; ++s) {
      const loadgen::Step& st = drv_.step();
      t.push_back(st.seconds());
      if (static_cast<int>(st.events.size()) != batch) {
        abort_all(ids);
        return errorf("decode step %d of batch %d advanced %zu requests", s, batch, st.events.size());
      }
    }
    abort_all(ids);
    // Step s feeds the token at position ctx + s; the median step's positions stand for all.
    out->push_back({"decode " + std::to_string(batch) + " @ " + std::to_string(ctx),
                    sim::work_of(p_, std::vector<sim::SeqSlice>(static_cast<size_t>(batch), {ctx + steps / 2, 1})),
                    median(t)});
    return Status::Ok();
  }

 private:
  engine::RequestParams params(int n, int max_tokens) {
    engine::RequestParams r;
    const int vocab = drv_.engine().model_info().vocab_size;
    for (int i = 0; i < n; ++i) r.prompt.push_back(static_cast<int32_t>(rng_.uniform_int(1, vocab - 1)));
    r.max_tokens = max_tokens;
    r.temperature = 0.0f;
    r.ignore_eos = true;
    return r;
  }
  void abort_all(const std::vector<engine::RequestId>& ids) {
    for (engine::RequestId id : ids) drv_.abort(id);
  }

  loadgen::Driver drv_;
  const sim::PlanInput& p_;
  Rng rng_;
};

}  // namespace

int sim_calibrate_main(int argc, char** argv) {
  Args args(argc, argv);
  if (args.help()) return print_usage(kHelp);
  args.flag("--calibrate");
  engine::EngineConfig ecfg;
  ecfg.model_path = default_model_path();
  std::string v, gpu = "cpu-local", out_path = sim::data_dir() + "/hardware.json";
  int64_t n = 0, seed = 0;
  Plan plan;
  args.value("--model", &ecfg.model_path, "-m");
  args.value("--gpu", &gpu);
  args.value("--out", &out_path);
  const bool no_save = args.flag("--no-save");
  if (args.value("--threads", &v, "-t")) {
    if (!parse_int(v, 1, 256, &n)) return fail("--threads must be an integer in 1..256, got '" + v + "'");
    ecfg.threads = static_cast<int>(n);
  }
  if (args.value("--prefill-lens", &v) && !to_int_list(v, 1, 8192, &plan.prefill_lens)) {
    return fail("--prefill-lens: expected a comma-separated list of token counts in 1..8192");
  }
  if (args.value("--decode-batches", &v) && !to_int_list(v, 1, 1024, &plan.decode_batches)) {
    return fail("--decode-batches: expected a comma-separated list of batch sizes in 1..1024");
  }
  if (args.value("--decode-ctx", &v) && !to_int_list(v, 1, 8192, &plan.decode_ctx)) {
    return fail("--decode-ctx: expected a comma-separated list of token counts in 1..8192");
  }
  if (args.value("--decode-steps", &v)) {
    if (!parse_int(v, 1, 1000, &n)) return fail("--decode-steps: expected an integer in 1..1000");
    plan.decode_steps = static_cast<int>(n);
  }
  if (args.value("--repeats", &v)) {
    if (!parse_int(v, 1, 100, &n)) return fail("--repeats: expected an integer in 1..100");
    plan.repeats = static_cast<int>(n);
  }
  if (args.value("--seed", &v) && !parse_int(v, 0, INT64_MAX, &seed)) return fail("--seed: expected an integer >= 0");
  if (std::string left = args.leftover(); !left.empty()) return fail(left + " (see pagoda sim --calibrate --help)");

  // The simulator's view of the model and device, exactly as `pagoda sim --model <gguf>` builds it.
  auto model = sim::resolve_model(ecfg.model_path);
  if (!model.ok()) return fail(model.message());
  if (model->source.rfind("gguf:", 0) != 0) return fail("--model must be a .gguf file: the engine runs it");
  auto hw = sim::load_hardware(gpu);
  if (!hw.ok()) return fail(hw.message());
  sim::PlanInput p;
  p.model = *model;
  p.hw = *hw;
  p.kv_dtype = kv::kv_dtype_f16();
  p.weights_from_file = true;

  // Room for every batch at once; f16 KV, as the simulation of a .gguf assumes.
  const int max_batch = *std::max_element(plan.decode_batches.begin(), plan.decode_batches.end());
  const int max_prefill = *std::max_element(plan.prefill_lens.begin(), plan.prefill_lens.end());
  const int max_ctx = *std::max_element(plan.decode_ctx.begin(), plan.decode_ctx.end());
  ecfg.kv_dtype = KvDtype::F16;
  ecfg.enable_prefix_caching = false;
  ecfg.max_num_seqs = std::max(64, max_batch);
  ecfg.max_num_batched_tokens = std::max({2048, max_prefill, max_batch * max_ctx});
  ecfg.num_kv_blocks =
      std::max(64, max_batch * ((max_ctx + plan.decode_steps + 2 + ecfg.block_size - 1) / ecfg.block_size) +
                       (max_prefill + ecfg.block_size - 1) / ecfg.block_size + 8);
  auto eng = engine::Engine::create(ecfg);
  if (!eng.ok()) return fail(eng.message());

  std::vector<sim::CalibrationSample> raw;
  Measurer m(**eng, p, static_cast<uint64_t>(seed));
  std::fprintf(stderr, "calibrating %s on %s with %d threads...\n", p.model.name.c_str(), p.hw.name.c_str(),
               ecfg.threads);
  {
    // Warm-up: fault the weights in, size the scratch buffers.
    std::vector<sim::CalibrationSample> warm;
    if (Status s = m.decode(std::min(4, max_batch), plan.decode_ctx.front(), 2, &warm); !s.ok()) return fail(s.message());
  }
  // Repeats go round the whole set, so a burst of load elsewhere on the machine
  // hits every kind of step alike instead of skewing the few it lands on.
  for (int r = 0; r < plan.repeats; ++r) {
    for (int len : plan.prefill_lens) {
      if (Status s = m.prefill(len, &raw); !s.ok()) return fail(s.message());
    }
    for (int ctx : plan.decode_ctx) {
      for (int b : plan.decode_batches) {
        if (Status s = m.decode(b, ctx, plan.decode_steps, &raw); !s.ok()) return fail(s.message());
      }
    }
  }
  // One sample per distinct step (same label, same work): the median time.
  std::vector<sim::CalibrationSample> samples;
  std::vector<std::vector<double>> times;
  for (const sim::CalibrationSample& x : raw) {
    auto it = std::find_if(samples.begin(), samples.end(), [&](const auto& y) { return y.label == x.label; });
    if (it == samples.end()) {
      samples.push_back(x);
      times.push_back({x.measured_s});
    } else {
      times[static_cast<size_t>(it - samples.begin())].push_back(x.measured_s);
    }
  }
  for (size_t k = 0; k < samples.size(); ++k) samples[k].measured_s = median(times[k]);

  std::string note;
  auto fit = sim::fit_cost_model(p, samples, &note);
  if (!fit.ok()) return fail(fit.message());
  std::printf("%s", sim::format_fit(p, samples, *fit).c_str());
  if (!note.empty()) std::printf("note: %s\n", note.c_str());
  if (no_save) return 0;
  if (Status s = sim::write_efficiency(out_path, p.hw.name, *fit); !s.ok()) return fail(s.message());
  std::printf("wrote %s: \"%s\" efficiency {compute %.6g, attention %.6g, bandwidth %.6g, step_overhead_s %.6g}\n",
              out_path.c_str(), p.hw.name.c_str(), fit->compute_efficiency, fit->attention_efficiency,
              fit->bandwidth_efficiency, fit->step_overhead_s);
  return 0;
}

}  // namespace pagoda::cli
