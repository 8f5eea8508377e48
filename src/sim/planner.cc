#include "sim/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "sim/json_util.h"
#include "sim/svg_plot.h"

// GCC 12 reports a false -Wrestrict on `"literal" + std::string&&` once inlined
// (GCC bug 105651); the string building below is ordinary.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wrestrict"
#endif

namespace pagoda::sim {

Expected<WeightsDtype> parse_weights_dtype(const std::string& s) {
  const std::string l = detail::lower(s);
  if (l == "f32" || l == "fp32") return WeightsDtype{"f32", 4.0};
  if (l == "bf16" || l == "fp16" || l == "f16") return WeightsDtype{l, 2.0};
  if (l == "fp8" || l == "int8") return WeightsDtype{l, 1.0};
  if (l == "q8_0") return WeightsDtype{l, 34.0 / 32.0};
  if (l == "q4" || l == "q4_0" || l == "int4") return WeightsDtype{l, 18.0 / 32.0};
  return errorf("unknown weights dtype '%s' (f32, bf16, fp16, fp8, int8, q8_0, q4)", s.c_str());
}

StateRows rank_state(const PlanInput& in) {
  const Expected<StateRows> st = in.model.state_on_rank(in.tp);
  return st.ok() ? *st : StateRows{};  // validate_plan_input refuses a state that does not split
}

kv::PoolRequest pool_request(const PlanInput& in, uint64_t budget_bytes) {
  kv::PoolRequest pr;
  pr.shape = kv::shard_for_tp(in.model.kv_shape(), in.tp);
  pr.dtype = in.kv_dtype;
  pr.layer_windows = in.model.layer_windows();
  const StateRows st = rank_state(in);
  pr.state_rows = st.rows;
  pr.state_row_bytes = static_cast<uint64_t>(st.row_floats) * sizeof(float);
  pr.hybrid = in.hybrid_kv;
  pr.block_size = in.block_size;
  pr.budget_bytes = budget_bytes;
  return pr;
}

uint64_t request_bytes(const PlanInput& in, int64_t L) {
  const kv::KvShape rank = kv::shard_for_tp(in.model.kv_shape(), in.tp);
  return kv::kv_bytes_for_sequence(rank, in.kv_dtype, L) + rank_state(in).bytes();
}

Status validate_plan_input(const PlanInput& in) {
  PAGODA_TRY(validate_model(in.model));
  if (in.tp < 1) return errorf("--tp must be >= 1 (got %d)", in.tp);
  if (auto st = in.model.state_on_rank(in.tp); !st.ok()) return errorf("--tp %d: %s", in.tp, st.message().c_str());
  if (in.context < 1) return errorf("--context must be >= 1 (got %lld)", static_cast<long long>(in.context));
  if (in.concurrency < 1) return errorf("--concurrency must be >= 1 (got %lld)", static_cast<long long>(in.concurrency));
  if (!(in.utilization > 0 && in.utilization <= 1)) return errorf("--utilization must be in (0, 1] (got %g)", in.utilization);
  if (in.block_size < 1) return errorf("--block-size must be >= 1 (got %d)", in.block_size);
  if (!(in.watermark >= 0 && in.watermark < 1)) return errorf("watermark must be in [0, 1) (got %g)", in.watermark);
  if (in.kv_cache_memory == 0 && in.hw.memory_bytes == 0) {
    return errorf("no device memory: give --gpu, --gpu-mem or --kv-cache-memory");
  }
  if (in.weights_from_file && in.model.weights_file_bytes == 0) {
    return errorf("model %s: no weight bytes known (not read from a GGUF file); give --weights-dtype",
                  in.model.name.c_str());
  }
  if (auto layout = kv::plan_pool_layout(pool_request(in, 0)); !layout.ok()) return layout.error();
  return Status::Ok();
}

namespace {

// Everything except min_tp (which calls this for each TP degree).
PlanReport plan_one(const PlanInput& in) {
  PlanReport r;
  const kv::KvShape shape = in.model.kv_shape();
  const kv::KvShape rank = kv::shard_for_tp(shape, in.tp);
  r.kv_bytes_per_token = kv::kv_bytes_per_token(shape, in.kv_dtype);
  r.kv_bytes_per_token_per_gpu = kv::kv_bytes_per_token(rank, in.kv_dtype);
  r.kv_bytes_per_request = request_bytes(in, in.context);
  r.state_bytes_per_sequence = rank_state(in).bytes();
  // The engine's pool layout (a tp degree whose rank cannot pack the state has none: no pool).
  const Expected<kv::PoolPlan> layout = kv::plan_pool_layout(pool_request(in, 0));
  if (layout.ok()) {
    r.kv_groups = layout->layout;
    r.kv_bytes_per_block = layout->block_bytes;
    r.state_blocks_per_sequence = layout->layout.state_blocks;
  }
  r.memory_bytes = in.hw.memory_bytes;

  if (in.kv_cache_memory > 0) {
    r.kv_budget_bytes = static_cast<int64_t>(in.kv_cache_memory);
  } else {
    const double tp = in.tp;
    r.usable_bytes = static_cast<uint64_t>(in.utilization * static_cast<double>(in.hw.memory_bytes));
    r.weights_bytes = in.weights_from_file
                          ? static_cast<uint64_t>(std::ceil(static_cast<double>(in.model.weights_file_bytes) / tp))
                          : static_cast<uint64_t>(std::ceil(static_cast<double>(in.model.params_total) *
                                                            in.weights.bytes_per_param / tp));
    const ModelDesc& m = in.model;
    const double mlp_width =
        m.is_moe() ? std::max<double>(m.ffn, double(m.experts_per_token + m.num_shared_experts) *
                                                 (m.moe_ffn > 0 ? m.moe_ffn : m.ffn))
                   : m.ffn;
    const double act = static_cast<double>(in.activation_tokens) * (4.0 * m.hidden + 2.0 * mlp_width / tp) * 2.0 +
                       static_cast<double>(in.logits_rows) * m.vocab / tp * 4.0;
    r.activation_bytes = static_cast<uint64_t>(std::ceil(act));
    r.runtime_overhead_bytes = in.hw.runtime_overhead_bytes;
    r.kv_budget_bytes = static_cast<int64_t>(r.usable_bytes) - static_cast<int64_t>(r.weights_bytes) -
                        static_cast<int64_t>(r.activation_bytes) - static_cast<int64_t>(r.runtime_overhead_bytes);
  }
  const uint64_t budget = r.kv_budget_bytes > 0 ? static_cast<uint64_t>(r.kv_budget_bytes) : 0;
  const uint64_t kv_room = budget > r.state_bytes_per_sequence ? budget - r.state_bytes_per_sequence : 0;
  r.max_tokens_in_cache = r.kv_bytes_per_token_per_gpu ? static_cast<int64_t>(kv_room / r.kv_bytes_per_token_per_gpu) : 0;
  r.max_concurrency = r.kv_bytes_per_request ? static_cast<int64_t>(budget / r.kv_bytes_per_request) : 0;

  // Longest L <= max_context with concurrency x bytes(L) <= budget (bytes(L) is non-decreasing).
  const auto need = [&](int64_t L) {
    const uint64_t per = request_bytes(in, L);
    const uint64_t c = static_cast<uint64_t>(in.concurrency);
    return per > budget / c + 1 ? UINT64_MAX : per * c;  // saturate instead of overflowing
  };
  int64_t lo = 0, hi = in.model.max_context;
  if (need(hi) <= budget) {
    lo = hi;
    r.longest_context_capped = true;
  } else {
    while (lo + 1 < hi) {  // need(lo) fits, need(hi) does not
      const int64_t mid = lo + (hi - lo) / 2;
      (need(mid) <= budget ? lo : hi) = mid;
    }
  }
  r.longest_context = lo;

  r.kv_bytes_needed = static_cast<uint64_t>(in.concurrency) * r.kv_bytes_per_request;
  r.fits = r.kv_budget_bytes >= 0 && r.kv_bytes_needed <= budget && in.context <= in.model.max_context;

  if (!layout.ok()) return r;
  r.num_blocks = kv::num_blocks_for_budget(budget, r.kv_bytes_per_block);
  if (r.num_blocks >= 2) {  // the pool the engine builds with this budget (plan_pool: >= 2 blocks)
    const Expected<kv::PoolPlan> pool = kv::plan_pool(pool_request(in, budget));
    if (pool.ok()) {
      r.num_blocks = pool->num_blocks;
      r.pool_max_tokens = pool->max_tokens;
    }
  }
  r.blocks_per_request = kv::kv_blocks_for_sequence(r.kv_groups, in.context, in.block_size);
  r.pool_max_concurrency = kv::max_concurrency(r.num_blocks, r.blocks_per_request, in.watermark);
  return r;
}

std::string with_commas(uint64_t v) {
  std::string s = std::to_string(v);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<size_t>(i), ",");
  return s;
}
std::string with_commas_signed(int64_t v) {
  return v < 0 ? "-" + with_commas(static_cast<uint64_t>(-v)) : with_commas(static_cast<uint64_t>(v));
}

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

std::string gib(double bytes) { return fmt("%.2f GiB", bytes / 0x1p30); }

// A report label padded to the value column.
std::string pad(std::string label) {
  if (label.size() < 28) label.resize(28, ' ');
  else label += ' ';
  return label;
}

}  // namespace

PlanReport plan_capacity(const PlanInput& in) {
  PlanReport r = plan_one(in);
  for (int32_t tp = 1; tp <= 64; tp *= 2) {
    if (in.model.num_heads % tp != 0) break;
    if (!in.model.state_on_rank(tp).ok()) break;  // the recurrent state does not split further
    PlanInput t = in;
    t.tp = tp;
    if (plan_one(t).fits) {
      r.min_tp = tp;
      break;
    }
  }
  return r;
}

bool FitTable::fits(size_t i, size_t j) const {
  return kv_budget_bytes >= 0 && contexts[i] <= max_context &&
         kv_bytes[i][j] <= static_cast<uint64_t>(kv_budget_bytes);
}

std::vector<int64_t> default_table_contexts() { return {2048, 4096, 8192, 16384, 32768, 65536, 131072}; }
std::vector<int64_t> default_table_concurrencies() { return {1, 2, 4, 8, 16, 32, 64, 128, 256}; }

FitTable fit_table(const PlanInput& in, const std::vector<int64_t>& contexts,
                   const std::vector<int64_t>& concurrencies) {
  FitTable t;
  t.contexts = contexts;
  t.concurrencies = concurrencies;
  t.kv_budget_bytes = plan_one(in).kv_budget_bytes;
  t.max_context = in.model.max_context;
  for (int64_t L : contexts) {
    const uint64_t per = request_bytes(in, L);
    std::vector<uint64_t> row;
    for (int64_t c : concurrencies) row.push_back(per * static_cast<uint64_t>(c));
    t.kv_bytes.push_back(std::move(row));
  }
  return t;
}

std::string format_report(const PlanInput& in, const PlanReport& r) {
  const ModelDesc& m = in.model;
  const kv::KvShape rank = kv::shard_for_tp(m.kv_shape(), in.tp);
  std::string s;
  s += "model        " + m.name + " (" + m.source + "): " + std::to_string(m.num_layers) + " layers, " +
       std::to_string(m.num_heads) + " heads, ";
  if (m.attention == kv::AttentionKind::kMLA) {
    s += "MLA latent " + std::to_string(m.kv_lora_rank) + " + rope " + std::to_string(m.qk_rope_head_dim);
  } else {
    s += std::to_string(m.num_kv_heads) + " KV heads x " + std::to_string(m.head_dim) + " (" +
         kv::attention_kind_name(m.attention) + ")";
  }
  if (m.sliding_window > 0) {
    const kv::KvShape sh = m.kv_shape();
    s += ", sliding window " + std::to_string(m.sliding_window) + " on " + std::to_string(sh.num_local_layers()) +
         " of " + std::to_string(m.num_layers) + " layers";
  }
  s += "\n             " + fmt("%.2f", m.params_total / 1e9) + " B params";
  if (m.is_moe()) s += " (" + fmt("%.2f", m.params_active / 1e9) + " B active)";
  s += ", max context " + with_commas(static_cast<uint64_t>(m.max_context)) + "\n";
  if (in.kv_cache_memory > 0) {
    s += "KV budget    " + with_commas(in.kv_cache_memory) + " B (" + gib(static_cast<double>(in.kv_cache_memory)) +
         ") given per device, tp " + std::to_string(in.tp) + "\n";
  } else {
    s += "device       " + in.hw.name + " x tp " + std::to_string(in.tp) + ": " +
         gib(static_cast<double>(in.hw.memory_bytes)) + " each, utilization " + fmt("%.2f", in.utilization) + "\n";
  }
  s += "dtypes       KV " + kv::kv_dtype_label(in.kv_dtype) + ", weights " +
       (in.weights_from_file ? std::string("as in the file") : in.weights.name) + "\n\n";

  const int32_t rec = m.num_recurrent_layers();
  if (rec > 0) {
    s += pad("KV cache per token") + with_commas(r.kv_bytes_per_token) + " B (whole model, the " +
         std::to_string(m.num_layers - rec) + " attention layers; the " + std::to_string(rec) +
         " recurrent layers hold none)\n";
    const StateRows st = rank_state(in);
    s += pad("recurrent state") + with_commas(r.state_bytes_per_sequence) + " B per sequence (" +
         with_commas(static_cast<uint64_t>(st.rows)) + " f32 rows of " + std::to_string(st.row_floats) +
         ", whatever its length" + (in.tp > 1 ? ", one rank's share" : "") + ") in " +
         std::to_string(r.state_blocks_per_sequence) +
         (r.state_blocks_per_sequence == 1 ? " pool block\n" : " pool blocks\n");
  } else {
    s += pad("KV cache per token") + with_commas(r.kv_bytes_per_token) + " B (whole model, every layer)\n";
  }
  if (in.tp > 1) {
    s += pad("  per GPU") + with_commas(r.kv_bytes_per_token_per_gpu) + " B (";
    if (m.attention == kv::AttentionKind::kMLA) s += "MLA latent replicated on every rank)\n";
    else s += std::to_string(rank.num_kv_heads) + " of " + std::to_string(m.num_kv_heads) + " KV heads per rank" +
              (m.num_kv_heads < in.tp ? ", replicated" : "") + ")\n";
  }
  s += pad("KV per request @ " + with_commas(static_cast<uint64_t>(in.context))) + with_commas(r.kv_bytes_per_request) + " B = " + gib(static_cast<double>(r.kv_bytes_per_request)) + " per GPU";
  if (m.sliding_window > 0) s += " (local layers hold at most the window)";
  if (rec > 0) s += " (K/V + the state)";
  s += "\n\n";

  if (in.kv_cache_memory == 0) {
    s += "memory per GPU\n";
    s += pad("  usable") + "  " + gib(static_cast<double>(r.usable_bytes)) + "  (" + fmt("%.2f", in.utilization) +
         " x " + gib(static_cast<double>(r.memory_bytes)) + ")\n";
    s += pad("  weights") + "- " + gib(static_cast<double>(r.weights_bytes)) + "  (";
    if (in.weights_from_file) s += with_commas(m.weights_file_bytes) + " B in the file";
    else s += fmt("%.2f", m.params_total / 1e9) + " B params x " + fmt("%g", in.weights.bytes_per_param) + " B";
    s += " / tp " + std::to_string(in.tp) + ")\n";
    s += pad("  runtime overhead") + "- " + gib(static_cast<double>(r.runtime_overhead_bytes)) + "  (context, workspaces, graphs)\n";
    s += pad("  activations") + "- " + gib(static_cast<double>(r.activation_bytes)) + "  (" +
         with_commas(static_cast<uint64_t>(in.activation_tokens)) + "-token prefill chunk + logits of " +
         std::to_string(in.logits_rows) + " sequences)\n";
    s += pad("  KV budget") + "= " + gib(static_cast<double>(r.kv_budget_bytes)) +
         (r.kv_budget_bytes < 0 ? "  -> the weights do not fit" : "") + "\n\n";
  }

  s += "capacity per GPU\n";
  s += pad("  max tokens in cache") + with_commas_signed(r.max_tokens_in_cache) +
       (rec > 0 ? " (beside one sequence's state)\n" : "\n");
  s += pad("  max concurrency @ " + with_commas(static_cast<uint64_t>(in.context))) + with_commas_signed(r.max_concurrency) + " requests\n";
  s += pad("  longest context @ C=" + std::to_string(in.concurrency)) + with_commas_signed(r.longest_context) +
       (r.longest_context_capped ? " tokens (the model's max context)" : " tokens") + "\n";
  s += pad("  target C=" + std::to_string(in.concurrency) + " x L=" + with_commas(static_cast<uint64_t>(in.context))) +
       "needs " + gib(static_cast<double>(r.kv_bytes_needed)) + " of " +
       gib(static_cast<double>(std::max<int64_t>(r.kv_budget_bytes, 0))) + " -> " +
       (r.fits ? "fits" : "does NOT fit") +
       (in.context > m.max_context ? " (context beyond the model's max)" : "") + "\n";
  s += pad("  smallest TP that fits") + (r.min_tp > 0 ? "tp " + std::to_string(r.min_tp) : std::string("none up to tp 64")) + "\n\n";

  s += "paged pool (block " + std::to_string(in.block_size) + " tokens = " + with_commas(r.kv_bytes_per_block) +
       " B per GPU)\n";
  s += pad("  blocks") + with_commas_signed(r.num_blocks) + "  (floor(budget / bytes per block))\n";
  if (rec > 0) {
    s += pad("  blocks per request") + with_commas_signed(r.blocks_per_request) + "  (" +
         with_commas_signed(r.blocks_per_request - r.state_blocks_per_sequence) + " K/V: ceil(" +
         with_commas(static_cast<uint64_t>(in.context)) + " / " + std::to_string(in.block_size) + "), + " +
         std::to_string(r.state_blocks_per_sequence) + " state)\n";
  } else if (r.kv_groups.num_groups() > 1) {
    int32_t windowed = 0;
    for (int32_t w : r.kv_groups.windows) windowed += w > 0 ? 1 : 0;
    s += pad("  KV cache groups") + std::to_string(r.kv_groups.num_groups()) + " of " +
         std::to_string(r.kv_groups.group_size) + " layers (" + std::to_string(windowed) +
         " sliding-window: they hold only their window)\n";
    s += pad("  blocks per request") + with_commas_signed(r.blocks_per_request) +
         "  (full groups ceil(L / block), window groups min(that, ceil((W - 1) / block) + 1))\n";
  } else {
    s += pad("  blocks per request") + with_commas_signed(r.blocks_per_request) + "  (ceil(" +
         with_commas(static_cast<uint64_t>(in.context)) + " / " + std::to_string(in.block_size) + "))\n";
  }
  s += pad("  max concurrency") + with_commas_signed(r.pool_max_concurrency) + "  (floor((blocks - 1 null - " +
       with_commas_signed(kv::watermark_blocks(r.num_blocks, in.watermark)) + " watermark) / blocks per request))\n";
  s += pad("  longest sequence") + with_commas_signed(r.pool_max_tokens) + " tokens (one sequence alone in the pool)\n";
  if (rec > 0) {
    s += "  state checkpoints (--state-checkpoint-interval, default every 4 blocks) take " +
         std::to_string(r.state_blocks_per_sequence) + " block(s) each from\n"
         "  free blocks only, on demand, and are evicted before a sequence is preempted: they do not lower the above\n";
  }
  return s;
}

std::string format_fit_table(const FitTable& t) {
  std::string s = "KV cache per GPU in GiB for context x concurrent requests; budget " +
                  gib(static_cast<double>(std::max<int64_t>(t.kv_budget_bytes, 0))) +
                  "; cells marked `x` do not fit.\n\n| context |";
  for (int64_t c : t.concurrencies) s += " " + std::to_string(c) + " |";
  s += "\n|---:|";
  for (size_t j = 0; j < t.concurrencies.size(); ++j) s += "---:|";
  s += "\n";
  for (size_t i = 0; i < t.contexts.size(); ++i) {
    const int64_t L = t.contexts[i];
    s += "| " + (L % 1024 == 0 ? std::to_string(L / 1024) + "k" : std::to_string(L)) + " |";
    for (size_t j = 0; j < t.concurrencies.size(); ++j) {
      const double g = static_cast<double>(t.kv_bytes[i][j]) / 0x1p30;
      s += " " + fmt(g < 10 ? "%.2f" : g < 100 ? "%.1f" : "%.0f", g) + (t.fits(i, j) ? "" : " x") + " |";
    }
    s += "\n";
  }
  return s;
}

std::string plan_to_json(const PlanInput& in, const PlanReport& r, const FitTable* table) {
  using nlohmann::json;
  const ModelDesc& m = in.model;
  json j;
  j["model"] = {{"name", m.name}, {"source", m.source}, {"layers", m.num_layers}, {"hidden", m.hidden},
                {"heads", m.num_heads}, {"kv_heads", m.num_kv_heads}, {"head_dim", m.head_dim},
                {"attention", kv::attention_kind_name(m.attention)}, {"sliding_window", m.sliding_window},
                {"swa_period", m.swa_period}, {"kv_lora_rank", m.kv_lora_rank},
                {"qk_rope_head_dim", m.qk_rope_head_dim}, {"params", m.params_total},
                {"params_active", m.params_active}, {"max_context", m.max_context}};
  j["device"] = {{"name", in.hw.name}, {"memory_bytes", in.hw.memory_bytes}, {"tp", in.tp},
                 {"utilization", in.utilization}};
  j.update({{"kv_dtype", kv::kv_dtype_label(in.kv_dtype)},
            {"weights_dtype", in.weights_from_file ? std::string("file") : in.weights.name},
            {"context", in.context}, {"concurrency", in.concurrency}, {"block_size", in.block_size},
            {"kv_cache_memory", in.kv_cache_memory}, {"kv_bytes_per_token", r.kv_bytes_per_token},
            {"kv_bytes_per_token_per_gpu", r.kv_bytes_per_token_per_gpu},
            {"kv_bytes_per_request", r.kv_bytes_per_request}, {"kv_bytes_per_block", r.kv_bytes_per_block},
            {"recurrent_layers", m.num_recurrent_layers()}, {"state_bytes_per_sequence", r.state_bytes_per_sequence},
            {"state_blocks_per_sequence", r.state_blocks_per_sequence}});
  j["memory_per_gpu"] = {{"usable", r.usable_bytes}, {"weights", r.weights_bytes},
                         {"activations", r.activation_bytes}, {"runtime_overhead", r.runtime_overhead_bytes},
                         {"kv_budget", r.kv_budget_bytes}};
  j.update({{"max_tokens_in_cache", r.max_tokens_in_cache}, {"max_concurrency", r.max_concurrency},
            {"longest_context", r.longest_context}, {"longest_context_capped", r.longest_context_capped},
            {"kv_bytes_needed", r.kv_bytes_needed}, {"fits", r.fits}, {"min_tp", r.min_tp}});
  j["pool"] = {{"num_blocks", r.num_blocks}, {"blocks_per_request", r.blocks_per_request},
               {"watermark_blocks", kv::watermark_blocks(r.num_blocks, in.watermark)},
               {"max_concurrency", r.pool_max_concurrency}, {"max_tokens", r.pool_max_tokens}};
  if (table) {
    json rows = json::array();
    for (size_t i = 0; i < table->contexts.size(); ++i) {
      json cells = json::array();
      for (size_t jx = 0; jx < table->concurrencies.size(); ++jx) {
        cells.push_back({{"concurrency", table->concurrencies[jx]}, {"kv_bytes", table->kv_bytes[i][jx]},
                         {"fits", table->fits(i, jx)}});
      }
      rows.push_back({{"context", table->contexts[i]}, {"cells", cells}});
    }
    j["table"] = rows;
  }
  return j.dump(2);
}

std::string kv_memory_plot_svg(const PlanInput& in, const std::vector<int64_t>& contexts, int64_t max_concurrency) {
  const PlanReport r = plan_one(in);
  LinePlot p;
  p.title = in.model.name + " on " + (in.kv_cache_memory > 0 ? std::string("a given KV budget") : in.hw.name) +
            ", tp " + std::to_string(in.tp) + ", KV " + kv::kv_dtype_label(in.kv_dtype);
  p.x_label = "concurrent requests";
  p.y_label = "KV cache per GPU (GiB)";
  p.x_min = 0;
  // Round the x range up to a whole tick step.
  const double raw_x = static_cast<double>(std::max<int64_t>(max_concurrency, 1));
  const std::vector<double> xt = nice_ticks(0, raw_x, 8);
  const double step = xt.size() > 1 ? xt[1] - xt[0] : 1;
  p.x_max = std::ceil(raw_x / step - 1e-9) * step;
  p.y_min = 0;
  const double budget_gib = static_cast<double>(std::max<int64_t>(r.kv_budget_bytes, 0)) / 0x1p30;
  const double mem_gib = static_cast<double>(in.kv_cache_memory > 0 ? in.kv_cache_memory : in.hw.memory_bytes) / 0x1p30;
  p.y_max = std::max(mem_gib, budget_gib) * 1.1;
  if (!(p.y_max > 0)) p.y_max = 1;
  p.width = 860;
  for (int64_t L : contexts) {
    PlotSeries ser;
    const double per = static_cast<double>(request_bytes(in, L)) / 0x1p30;
    const int64_t fit = per > 0 ? static_cast<int64_t>(std::floor(budget_gib / per)) : 0;
    ser.label = "context " + (L % 1024 == 0 ? std::to_string(L / 1024) + "k" : std::to_string(L)) +
                " (max " + std::to_string(fit) + ")";
    ser.points = {{0.0, 0.0}, {p.x_max, p.x_max * per}};
    if (fit > 0 && static_cast<double>(fit) <= p.x_max) ser.markers = {{static_cast<double>(fit), fit * per}};
    p.series.push_back(std::move(ser));
  }
  p.hlines.push_back({"KV budget " + fmt("%.1f GiB", budget_gib), budget_gib});
  if (in.kv_cache_memory == 0) p.hlines.push_back({"device memory " + fmt("%.0f GiB", mem_gib), mem_gib});
  return render_svg(p);
}

}  // namespace pagoda::sim
