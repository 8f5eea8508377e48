#include "cli/plan_flags.h"

#include <tuple>

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
  if (args.value("--kv-dtype", &v, "--kv-cache-dtype")) {
    auto d = kv::parse_kv_dtype(v);
    if (!d.ok()) return "--kv-dtype: " + d.message();
    in->kv_dtype = *d;
  }
  // llama.cpp's -ctk / -ctv: K's and V's type each (the other keeps its type).
  kv::KvDtype k = kv::kv_k_dtype(in->kv_dtype), vt = kv::kv_v_dtype(in->kv_dtype);
  bool pair = false;
  for (auto [flag, alias, out] : {std::tuple{"--cache-type-k", "-ctk", &k}, std::tuple{"--cache-type-v", "-ctv", &vt}}) {
    if (!args.value(flag, &v, alias)) continue;
    auto d = kv::parse_kv_dtype(v);
    if (!d.ok() || d->v_block_bytes > 0) return std::string(alias) + "/" + flag + ": unknown KV cache type '" + v + "'";
    *out = *d;
    pair = true;
  }
  if (pair) in->kv_dtype = kv::kv_dtype_pair(k, vt);
  if (args.value("--weights-dtype", &v)) {
    auto d = sim::parse_weights_dtype(v);
    if (!d.ok()) return d.message();
    in->weights = *d;
    in->weights_from_file = false;
  }
  return "";
}

}  // namespace pagoda::cli
