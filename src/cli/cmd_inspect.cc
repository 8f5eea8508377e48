// pagoda inspect MODEL.gguf | PRESET | config.json [--json] [--metadata] [--tensors]
// Architecture, parameter count, tensor types, attention shape and the KV cache
// cost per token and per full-context sequence for each KV dtype.
#include <cctype>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "base/kv_dtype.h"
#include "cli/cli_util.h"
#include "cli/command.h"
#include "cli/engine_flags.h"
#include "gguf/gguf.h"
#include "sim/model_desc.h"
#include "sim/planner.h"

namespace pagoda::cli {
namespace {

std::string with_commas(uint64_t v) {
  const std::string digits = std::to_string(v);
  std::string s;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) s += ',';
    s += digits[i];
  }
  return s;
}

// An int key that may also be a per-layer array (then: the sum over layers,
// and *per_layer is set); -1 when missing.
int64_t int_or_layer_sum(const gguf::GgufFile& f, const std::string& key, bool* per_layer) {
  const gguf::Value* v = f.find(key);
  if (!v) return -1;
  if (v->is_int()) return v->as_int();
  if (v->type == gguf::ValueType::ARRAY) {
    int64_t sum = 0;
    for (const auto& e : v->arr) sum += e.is_number() ? e.as_int() : 0;
    if (per_layer) *per_layer = true;
    return sum;
  }
  return -1;
}

// Hybrid models (lfm2, qwen35): a recurrent state of constant size per
// sequence beside the attention layers' K/V, kept in blocks of the KV pool
// (kv/recurrent_state_group.cc). The pool a --kv-cache-memory budget gives and
// the sequences it holds: the planner of `pagoda size` and `pagoda sim`
// (sim::plan_capacity -> kv::plan_pool, the engine's arithmetic; f16, blocks of
// 16, watermark 0.01: the engine's defaults). Prefix hits restore the state
// from checkpoints (kv/state_checkpoint.cc), which take free blocks only.
struct HybridPlan {
  sim::PlanInput in;
  sim::PlanReport report;
};
// The plan into *out; false (the error printed) when the model cannot be planned.
bool plan_hybrid(const sim::ModelDesc& md, int64_t kv_memory, int64_t context, HybridPlan* out) {
  HybridPlan& h = *out;
  h.in.model = md;
  h.in.kv_dtype = kv::kv_dtype_f16();
  h.in.weights_from_file = md.weights_file_bytes > 0;  // irrelevant with a given budget
  h.in.kv_cache_memory = static_cast<uint64_t>(kv_memory);
  h.in.block_size = 16;
  h.in.watermark = 0.01;
  h.in.context = context > 0 ? context : md.max_context;
  if (const Status st = sim::validate_plan_input(h.in); !st.ok()) {
    std::fprintf(stderr, "pagoda inspect: %s\n", st.message().c_str());
    return false;
  }
  h.report = sim::plan_capacity(h.in);
  // The engine caps its context at the longest sequence the pool holds.
  if (context == 0 && h.report.pool_max_tokens > 0 && h.in.context > h.report.pool_max_tokens) {
    h.in.context = h.report.pool_max_tokens;
    h.report = sim::plan_capacity(h.in);
  }
  return true;
}

void hybrid_json(const HybridPlan& h, int64_t kv_memory, nlohmann::json& j) {
  const sim::ModelDesc& md = h.in.model;
  const sim::PlanReport& plan = h.report;
  j["recurrent_state"] = {{"layers", md.num_recurrent_layers()},
                          {"attention_layers", md.kv_shape().num_layers},
                          {"bytes_per_sequence", plan.state_bytes_per_sequence},
                          {"f16_kv_bytes_per_token", plan.kv_bytes_per_token},
                          {"prefix_caching", "state_checkpoints"},
                          {"checkpoint_interval_blocks_default", 4}};
  j["kv_pool"] = {{"kv_cache_memory", kv_memory},
                  {"kv_dtype", "f16"},
                  {"block_size", h.in.block_size},
                  {"block_bytes", plan.kv_bytes_per_block},
                  {"num_blocks", plan.num_blocks},
                  {"state_blocks_per_sequence", plan.state_blocks_per_sequence},
                  {"context", h.in.context},
                  {"blocks_per_sequence", plan.blocks_per_request},
                  {"max_sequences", plan.pool_max_concurrency},
                  {"max_tokens", plan.pool_max_tokens}};
}

void hybrid_text(const HybridPlan& h, int64_t kv_memory) {
  const sim::PlanReport& plan = h.report;
  std::printf("recurrent state: %d recurrent layers, %s bytes (f32) per sequence whatever its length, kept in\n"
              "  KV blocks of its own (the K/V above is the %lld attention layers' only)\n",
              h.in.model.num_recurrent_layers(), with_commas(plan.state_bytes_per_sequence).c_str(),
              static_cast<long long>(h.in.model.kv_shape().num_layers));
  std::printf("KV pool of %s bytes (f16, blocks of %d tokens = %s bytes): %s blocks; a sequence of %s tokens\n"
              "  holds %s blocks (%d of them its state): %s sequences at once (watermark 0.01); one alone: %s tokens\n",
              with_commas(static_cast<uint64_t>(kv_memory)).c_str(), h.in.block_size,
              with_commas(plan.kv_bytes_per_block).c_str(), with_commas(static_cast<uint64_t>(plan.num_blocks)).c_str(),
              with_commas(static_cast<uint64_t>(h.in.context)).c_str(),
              with_commas(static_cast<uint64_t>(plan.blocks_per_request)).c_str(), plan.state_blocks_per_sequence,
              with_commas(static_cast<uint64_t>(plan.pool_max_concurrency)).c_str(),
              with_commas(static_cast<uint64_t>(plan.pool_max_tokens)).c_str());
  std::printf("state checkpoints: a copy of the state every 4 KV blocks (--state-checkpoint-interval K; 0: off, and\n"
              "  no prefix caching), cached like blocks; a prefix hit ends at the latest checkpoint it covers.\n"
              "  They take free blocks only, on demand, and are evicted first: they do not lower the sequences above\n");
}

// A preset name or a Hugging Face config (no GGUF file): the shape the sizing
// reads (sim::resolve_model), its K/V per token and, for a hybrid, the state and the pool.
int inspect_desc(const sim::ModelDesc& md, bool json, int64_t kv_memory, int64_t context) {
  const kv::KvShape shape = md.kv_shape();
  const uint64_t f16_per_token = kv::kv_bytes_per_token(shape, kv::kv_dtype_f16());
  HybridPlan h;
  if (md.num_recurrent_layers() > 0 && !plan_hybrid(md, kv_memory, context, &h)) return 1;
  if (json) {
    nlohmann::json j;
    j["name"] = md.name;
    j["source"] = md.source;
    j["architecture"] = md.arch;
    j["parameters"] = md.params_total;
    j["context_length"] = md.max_context;
    j["n_layer"] = md.num_layers;
    j["n_embd"] = md.hidden;
    j["n_head"] = md.num_heads;
    j["n_head_kv"] = md.num_kv_heads;
    j["head_dim"] = md.head_dim;
    j["n_ff"] = md.ffn;
    j["vocab_size"] = md.vocab;
    j["kv_bytes_per_token"] = {{"f16", f16_per_token}};
    if (md.num_recurrent_layers() > 0) hybrid_json(h, kv_memory, j);
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("model:         %s (%s), no GGUF file: the shape only\n", md.name.c_str(), md.source.c_str());
  std::printf("architecture:  %s, %d layers, %d heads, %d KV heads x %d, hidden %d\n", md.arch.c_str(), md.num_layers,
              md.num_heads, md.num_kv_heads, md.head_dim, md.hidden);
  std::printf("parameters:    %s\n", with_commas(static_cast<uint64_t>(md.params_total)).c_str());
  std::printf("KV cache:      %s bytes per token (f16, %d attention layers)\n", with_commas(f16_per_token).c_str(),
              shape.num_layers);
  if (md.num_recurrent_layers() > 0) hybrid_text(h, kv_memory);
  return 0;
}

int run_inspect(int argc, char** argv) {
  Args args(argc, argv);  // the one parser of every subcommand (cli/engine_flags.h)
  if (args.help()) {
    std::printf("usage: pagoda inspect [MODEL.gguf | PRESET | config.json | -m ...] [--json] [--metadata] [--tensors]\n"
                "                      [--kv-cache-memory BYTES] [--context L]\n"
                "  Prints architecture, parameter count, tensor types, attention shape and KV cache\n"
                "  bytes per token / per full-context sequence. Hybrid models (lfm2, qwen35): the\n"
                "  recurrent state per sequence and the sequences of L tokens (default: the model's\n"
                "  context) a --kv-cache-memory pool (default 256MiB, f16, blocks of 16) holds, by the\n"
                "  engine's arithmetic. A preset (data/models.json) or a Hugging Face config.json: the\n"
                "  shape, K/V per token and, for a hybrid, the state and the pool alone. Default model: %s\n",
                default_model_path().c_str());
    return 0;
  }
  std::string path;
  args.value("--model", &path, "-m");
  const bool json = args.flag("--json"), show_meta = args.flag("--metadata"), show_tensors = args.flag("--tensors");
  int64_t kv_memory = 256ll << 20, context = 0;  // the engine's default pool; 0: the model's context
  std::string v;
  if (args.value("--kv-cache-memory", &v) && (!parse_bytes(v, &kv_memory) || kv_memory <= 0)) {
    std::fprintf(stderr, "pagoda inspect: --kv-cache-memory must be a byte size like 512MiB, got '%s'\n", v.c_str());
    return 2;
  }
  if (args.value("--context", &v, "-c") && !parse_int(v, 1, int64_t{1} << 40, &context)) {
    std::fprintf(stderr, "pagoda inspect: --context must be a positive integer, got '%s'\n", v.c_str());
    return 2;
  }
  if (std::string err = args.leftover(/*flags_only=*/true); !err.empty()) {
    std::fprintf(stderr, "pagoda inspect: %s\n", err.c_str());
    return 2;
  }
  const std::vector<std::string> pos = args.positionals();
  if (pos.size() > 1 || (!pos.empty() && !path.empty())) {
    std::fprintf(stderr, "pagoda inspect: more than one model path given\n");
    return 2;
  }
  if (!pos.empty()) path = pos[0];
  if (path.empty()) path = default_model_path();
  std::string lower = path;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower.size() < 5 || lower.compare(lower.size() - 5, 5, ".gguf") != 0) {
    // A preset name or a Hugging Face config.json (or its folder).
    if (show_meta || show_tensors) {
      std::fprintf(stderr, "pagoda inspect: --metadata and --tensors need a GGUF file\n");
      return 2;
    }
    auto md = sim::resolve_model(path);
    if (!md.ok()) {
      std::fprintf(stderr, "pagoda inspect: %s\n", md.message().c_str());
      return 1;
    }
    return inspect_desc(*md, json, kv_memory, context);
  }

  auto opened = gguf::GgufFile::open(path);
  if (!opened.ok()) {
    std::fprintf(stderr, "pagoda inspect: %s\n", opened.message().c_str());
    return 1;
  }
  const gguf::GgufFile& f = **opened;
  const std::string arch = f.architecture();
  const std::string p = arch + ".";

  uint64_t params = 0;
  std::map<std::string, std::pair<uint64_t, uint64_t>> hist;  // type -> (count, bytes)
  for (const auto& t : f.tensors()) {
    params += t.n_elements;
    auto& h = hist[ggml_type_info(t.type).name];
    h.first += 1;
    h.second += t.n_bytes;
  }
  bool kv_per_layer = false;
  const int64_t n_layer = f.get_int_or(p + "block_count", -1);
  const int64_t n_embd = f.get_int_or(p + "embedding_length", -1);
  const int64_t n_head = int_or_layer_sum(f, p + "attention.head_count", nullptr);
  int64_t n_head_kv = int_or_layer_sum(f, p + "attention.head_count_kv", &kv_per_layer);
  if (n_head_kv < 0) n_head_kv = n_head;
  const int64_t n_ctx = f.get_int_or(p + "context_length", -1);
  const int64_t n_ff = f.get_int_or(p + "feed_forward_length", -1);
  int64_t n_vocab = f.get_int_or(p + "vocab_size", -1);
  if (n_vocab < 0) {
    if (const gguf::Value* v = f.find("tokenizer.ggml.tokens"); v && v->type == gguf::ValueType::ARRAY)
      n_vocab = static_cast<int64_t>(v->arr.size());
  }
  int64_t head_dim_k = f.get_int_or(p + "attention.key_length", -1);
  // A per-layer head_count_kv beside one head_count (lfm2: 0 marks a recurrent layer) keeps n_embd / n_head.
  const gguf::Value* hc = f.find(p + "attention.head_count");
  if (head_dim_k < 0 && n_embd > 0 && n_head > 0 && (!kv_per_layer || (hc && hc->is_int()))) head_dim_k = n_embd / n_head;
  int64_t head_dim_v = f.get_int_or(p + "attention.value_length", head_dim_k);

  // KV bytes per token over all layers. A per-layer head_count_kv array is
  // already summed over layers, so the layer factor is then 1.
  const bool have_kv = n_layer > 0 && n_head_kv > 0 && head_dim_k > 0 && head_dim_v > 0;
  // Hybrid models: only the attention layers hold K/V (sim::ModelDesc reads which
  // layers are recurrent: lfm2's 0 in head_count_kv, qwen35's full_attention_interval).
  const Expected<sim::ModelDesc> md = sim::resolve_model(path);
  const int64_t attn_layers = md.ok() ? md->kv_shape().num_layers : n_layer;
  const int64_t layer_factor = kv_per_layer ? 1 : attn_layers;
  struct KvCost { const char* name; int64_t per_token; };  // -1: not representable
  std::vector<KvCost> kv;
  for (KvDtype d : kAllKvDtypes) {
    int64_t per_token = -1;
    if (have_kv) {
      const int64_t k_n = n_head_kv * head_dim_k, v_n = n_head_kv * head_dim_v;
      const bool ok = !kv_dtype_is_quantized(d) || (k_n % 32 == 0 && v_n % 32 == 0);
      if (ok)
        per_token = layer_factor * static_cast<int64_t>(kv_row_bytes(d, k_n) + kv_row_bytes(d, v_n));
    }
    kv.push_back({kv_dtype_name(d), per_token});
  }

  // Sliding-window layers (gemma3, ...): the KV the hybrid manager holds, with
  // the one arithmetic of kv/sizing (f16, blocks of 16, a 32,768-token sequence).
  struct WindowKv {
    int32_t window = 0, global_layers = 0, local_layers = 0;
    uint64_t global_per_token = 0, local_per_token = 0;  // f16, all layers of the kind
    uint64_t exact_32k = 0;      // global x 32768 + local x min(32768, window) tokens
    uint64_t held_32k = 0;       // the allocator's blocks x bytes per block
    int32_t groups = 0, group_size = 0;
  } wk;
  constexpr int64_t kSeq = 32768;
  if (md.ok() && md->sliding_window > 0) {
    const kv::KvShape shape = md->kv_shape();
    const kv::KvDtype f16 = kv::kv_dtype_f16();
    const uint64_t per_layer = kv::kv_bytes_per_token_per_layer(shape, f16);
    const kv::KvGroupLayout layout = kv::kv_group_layout(kv::kv_layer_windows(shape), /*hybrid=*/true);
    wk.window = shape.sliding_window;
    wk.local_layers = shape.num_local_layers();
    wk.global_layers = shape.num_global_layers();
    wk.global_per_token = per_layer * static_cast<uint64_t>(wk.global_layers);
    wk.local_per_token = per_layer * static_cast<uint64_t>(wk.local_layers);
    wk.exact_32k = kv::kv_bytes_for_sequence(shape, f16, kSeq);
    wk.held_32k = static_cast<uint64_t>(kv::kv_blocks_for_sequence(layout, kSeq, 16)) *
                  kv::kv_group_bytes_per_block(shape, f16, 16, layout);
    wk.groups = layout.num_groups();
    wk.group_size = layout.group_size;
  }

  const int32_t state_layers = md.ok() ? md->num_recurrent_layers() : 0;
  HybridPlan hybrid;
  if (state_layers > 0 && !plan_hybrid(*md, kv_memory, context, &hybrid)) return 1;

  if (json) {
    nlohmann::json j;
    j["path"] = path;
    j["file_size"] = f.file_size();
    j["gguf_version"] = f.version();
    j["alignment"] = f.alignment();
    j["architecture"] = arch;
    j["name"] = f.get_string_or("general.name", "");
    j["n_tensors"] = f.tensors().size();
    j["parameters"] = params;
    nlohmann::json types = nlohmann::json::object();
    for (const auto& [name, cb] : hist) types[name] = {{"count", cb.first}, {"bytes", cb.second}};
    j["tensor_types"] = types;
    auto num = [](int64_t v) { return v >= 0 ? nlohmann::json(v) : nlohmann::json(nullptr); };
    j["context_length"] = num(n_ctx);
    j["n_layer"] = num(n_layer);
    j["n_embd"] = num(n_embd);
    j["n_head"] = num(n_head);
    j["n_head_kv"] = num(n_head_kv);
    j["head_dim"] = num(head_dim_k);
    j["head_dim_v"] = num(head_dim_v);
    j["n_ff"] = num(n_ff);
    j["vocab_size"] = num(n_vocab);
    nlohmann::json per_tok = nlohmann::json::object(), full = nlohmann::json::object();
    for (const auto& k : kv) {
      per_tok[k.name] = num(k.per_token);
      full[k.name] = k.per_token >= 0 && n_ctx > 0 ? nlohmann::json(k.per_token * n_ctx) : nlohmann::json(nullptr);
    }
    j["kv_bytes_per_token"] = per_tok;
    j["kv_bytes_full_context"] = full;
    if (wk.window > 0) {
      j["kv_sliding_window"] = {{"window", wk.window},
                                {"global_layers", wk.global_layers},
                                {"window_layers", wk.local_layers},
                                {"f16_bytes_per_token_global_layers", wk.global_per_token},
                                {"f16_bytes_per_token_window_layers", wk.local_per_token},
                                {"f16_bytes_32k_sequence_exact", wk.exact_32k},
                                {"f16_bytes_32k_sequence_held", wk.held_32k},
                                {"kv_groups", wk.groups},
                                {"kv_group_layers", wk.group_size}};
    }
    if (state_layers > 0) hybrid_json(hybrid, kv_memory, j);
    if (show_meta) {
      nlohmann::json m = nlohmann::json::object();
      for (const auto& [k, v] : f.metadata()) m[k] = gguf::format_value(v, 8);
      j["metadata"] = m;
    }
    if (show_tensors) {
      nlohmann::json ts = nlohmann::json::array();
      for (const auto& t : f.tensors())
        ts.push_back({{"name", t.name}, {"type", ggml_type_info(t.type).name}, {"dims", t.dims},
                      {"offset", t.offset}, {"bytes", t.n_bytes}});
      j["tensors"] = ts;
    }
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }

  auto show = [](int64_t v) { return v >= 0 ? std::to_string(v) : std::string("?"); };
  std::printf("file:          %s (%s, GGUF v%u, alignment %" PRIu64 ")\n", path.c_str(),
              human_bytes(static_cast<double>(f.file_size())).c_str(), f.version(), f.alignment());
  std::printf("architecture:  %s\n", arch.empty() ? "?" : arch.c_str());
  if (auto n = f.get_string_or("general.name", ""); !n.empty()) std::printf("name:          %s\n", n.c_str());
  std::printf("parameters:    %s (%.1fM) in %zu tensors\n", with_commas(params).c_str(), params / 1e6,
              f.tensors().size());
  std::printf("tensor types: ");
  for (const auto& [name, cb] : hist)
    std::printf(" %s x%" PRIu64 " (%s)", name.c_str(), cb.first, human_bytes(static_cast<double>(cb.second)).c_str());
  std::printf("\n");
  std::printf("context:       %s tokens\n", show(n_ctx).c_str());
  std::printf("layers %s, embedding %s, heads %s, kv heads %s%s, head dim %s", show(n_layer).c_str(),
              show(n_embd).c_str(), show(n_head).c_str(), show(n_head_kv).c_str(),
              kv_per_layer ? " (sum over layers)" : "", show(head_dim_k).c_str());
  if (head_dim_v != head_dim_k) std::printf(" (v %s)", show(head_dim_v).c_str());
  std::printf(", ffn %s, vocab %s\n", show(n_ff).c_str(), show(n_vocab).c_str());
  if (have_kv) {
    std::printf("KV cache per token (K+V, all layers):\n");
    for (const auto& k : kv) {
      if (k.per_token < 0) {
        std::printf("  %-5s n/a (row not a multiple of 32)\n", k.name);
        continue;
      }
      std::printf("  %-5s %10s bytes/token", k.name, with_commas(static_cast<uint64_t>(k.per_token)).c_str());
      if (n_ctx > 0)
        std::printf("   %12s per %s-token sequence", human_bytes(static_cast<double>(k.per_token) * n_ctx).c_str(),
                    with_commas(static_cast<uint64_t>(n_ctx)).c_str());
      std::printf("\n");
    }
    if (wk.window > 0) {
      std::printf("  sliding window %d: per token (f16) %s bytes in the %d global layers, %s bytes in the %d window\n"
                  "  layers (which keep at most %d tokens)\n",
                  wk.window, with_commas(wk.global_per_token).c_str(), wk.global_layers,
                  with_commas(wk.local_per_token).c_str(), wk.local_layers, wk.window);
      std::printf("  per %s-token sequence (f16): %s bytes exact (global x %s + window layers x %d tokens);\n"
                  "  the hybrid KV cache manager (%d groups of %d layers, blocks of 16) holds %s bytes\n",
                  with_commas(static_cast<uint64_t>(kSeq)).c_str(), with_commas(wk.exact_32k).c_str(),
                  with_commas(static_cast<uint64_t>(kSeq)).c_str(), wk.window, wk.groups, wk.group_size,
                  with_commas(wk.held_32k).c_str());
    }
  } else if (state_layers > 0 && state_layers == n_layer) {
    std::printf("KV cache:      none (no attention layer: every layer is recurrent)\n");
  } else {
    std::printf("KV cache:      unknown (attention shape missing from metadata)\n");
  }
  if (state_layers > 0) hybrid_text(hybrid, kv_memory);
  if (show_meta) {
    std::printf("metadata (%zu keys):\n", f.metadata().size());
    for (const auto& [k, v] : f.metadata())
      std::printf("  %-44s %-8s %s\n", k.c_str(), gguf::value_type_name(v.type), gguf::format_value(v, 8).c_str());
  }
  if (show_tensors) {
    std::printf("tensors:\n");
    for (const auto& t : f.tensors()) {
      std::string dims;
      for (size_t i = 0; i < t.dims.size(); ++i) dims += (i ? " x " : "") + std::to_string(t.dims[i]);
      std::printf("  %-32s %-5s [%s] @%" PRIu64 " %s\n", t.name.c_str(), ggml_type_info(t.type).name, dims.c_str(),
                  t.offset, human_bytes(static_cast<double>(t.n_bytes)).c_str());
    }
  }
  return 0;
}

Register reg_inspect("inspect", "show a GGUF model's architecture, tensors and KV cache cost", run_inspect);

}  // namespace
}  // namespace pagoda::cli
