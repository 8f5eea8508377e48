#include "cli/plan_flags.h"

#include "cli/engine_flags.h"
#include "sim/hardware.h"
#include "sim/model_desc.h"  // and kv/sizing.h: kv::parse_kv_dtype

namespace pagoda::cli {

std::string parse_plan_dtype_flags(Args& args, sim::PlanInput* in) {
  std::string v;
  if (args.value("--kv-cache-memory", &v)) {
    auto b = sim::parse_bytes(v);
    if (!b.ok()) return "--kv-cache-memory: " + b.message();
    if (*b == 0) return "--kv-cache-memory: must be > 0";
    in->kv_cache_memory = *b;
  }
  if (args.value("--kv-dtype", &v)) {
    auto d = kv::parse_kv_dtype(v);
    if (!d.ok()) return d.message();
    in->kv_dtype = *d;
  }
  if (args.value("--weights-dtype", &v)) {
    auto d = sim::parse_weights_dtype(v);
    if (!d.ok()) return d.message();
    in->weights = *d;
    in->weights_from_file = false;
  }
  return "";
}

}  // namespace pagoda::cli
