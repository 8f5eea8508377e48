// pagoda inspect MODEL.gguf [--json] [--metadata] [--tensors]
// Architecture, parameter count, tensor types, attention shape and the KV cache
// cost per token and per full-context sequence for each KV dtype.
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

int run_inspect(int argc, char** argv) {
  Args args(argc, argv);  // the one parser of every subcommand (cli/engine_flags.h)
  if (args.help()) {
    std::printf("usage: pagoda inspect [MODEL.gguf | -m MODEL.gguf] [--json] [--metadata] [--tensors]\n"
                "  Prints architecture, parameter count, tensor types, attention shape and KV cache\n"
                "  bytes per token / per full-context sequence. Default model: %s\n",
                default_model_path().c_str());
    return 0;
  }
  std::string path;
  args.value("--model", &path, "-m");
  const bool json = args.flag("--json"), show_meta = args.flag("--metadata"), show_tensors = args.flag("--tensors");
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
  // qwen35 marks its recurrent layers by full_attention_interval (default 4), not
  // by 0 in a per-layer head_count_kv: only its attention layers hold K/V.
  int64_t attn_layers = n_layer;
  if (arch == "qwen35" && n_layer > 0) {
    const int64_t interval = f.get_int_or(p + "full_attention_interval", 4);
    if (interval > 0) attn_layers = n_layer / interval;
  }
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
  if (auto md = sim::resolve_model(path); md.ok() && md->sliding_window > 0) {
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

  // Hybrid models (lfm2): a recurrent state of constant size per sequence beside
  // the attention layers' K/V (counted above; recurrent layers have 0 KV heads),
  // as kv/recurrent_state_group.cc keeps it. Prefix hits restore it from state
  // checkpoints (kv/state_checkpoint.cc; serve's --state-checkpoint-interval, default 4 blocks).
  int64_t state_layers = 0, state_bytes = 0;
  if (const gguf::Value* lc = f.find(p + "shortconv.l_cache"); lc && lc->is_int() && n_embd > 0) {
    if (const gguf::Value* kvh = f.find(p + "attention.head_count_kv"); kvh && kvh->type == gguf::ValueType::ARRAY)
      for (const gguf::Value& e : kvh->arr) state_layers += e.is_int() && e.as_int() == 0 ? 1 : 0;
    state_bytes = state_layers * (lc->as_int() - 1) * n_embd * static_cast<int64_t>(sizeof(float));
  }

  // qwen35 (model/qwen35.cc's read_hparams): (conv_kernel - 1) x conv_dim + v_heads x
  // S x S f32 per gated delta-net layer (all but every full_attention_interval-th).
  if (arch == "qwen35" && n_layer > 0) {
    const int64_t K = f.get_int_or(p + "ssm.conv_kernel", 0), S = f.get_int_or(p + "ssm.state_size", 0);
    const int64_t hk = f.get_int_or(p + "ssm.group_count", 0), hv = f.get_int_or(p + "ssm.time_step_rank", 0);
    const int64_t interval = f.get_int_or(p + "full_attention_interval", 4);
    if (K >= 2 && S > 0 && hk > 0 && hv > 0 && interval > 0) {
      for (int64_t l = 0; l < n_layer; ++l) state_layers += (l + 1) % interval != 0 ? 1 : 0;
      state_bytes = state_layers * ((K - 1) * (2 * hk + hv) * S + hv * S * S) * static_cast<int64_t>(sizeof(float));
    }
  }

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
    if (state_layers > 0) {
      j["recurrent_state"] = {{"layers", state_layers},
                              {"bytes_per_sequence", state_bytes},
                              {"prefix_caching", "state_checkpoints"},
                              {"checkpoint_interval_blocks_default", 4}};
    }
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
  } else {
    std::printf("KV cache:      unknown (attention shape missing from metadata)\n");
  }
  if (state_layers > 0) {
    std::printf("recurrent state: %lld recurrent layers, %s bytes (f32) per sequence whatever its length, kept in\n"
                "  KV blocks of its own (the K/V above is the attention layers' only)\n"
                "state checkpoints: a copy of the state every 4 KV blocks (--state-checkpoint-interval K; 0: off, and\n"
                "  no prefix caching), cached like blocks; a prefix hit ends at the latest checkpoint it covers\n",
                static_cast<long long>(state_layers), with_commas(static_cast<uint64_t>(state_bytes)).c_str());
  }
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
