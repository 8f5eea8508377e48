#include "kv/sizing.h"

#include <algorithm>
#include <cctype>
#include <cmath>

namespace pagoda::kv {

const char* attention_kind_name(AttentionKind k) {
  switch (k) {
    case AttentionKind::kMHA: return "mha";
    case AttentionKind::kGQA: return "gqa";
    case AttentionKind::kMQA: return "mqa";
    case AttentionKind::kMLA: return "mla";
  }
  return "?";
}

namespace {
std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
}  // namespace

Expected<AttentionKind> parse_attention_kind(const std::string& s) {
  const std::string l = lower(s);
  if (l == "mha") return AttentionKind::kMHA;
  if (l == "gqa") return AttentionKind::kGQA;
  if (l == "mqa") return AttentionKind::kMQA;
  if (l == "mla") return AttentionKind::kMLA;
  return errorf("unknown attention kind '%s' (mha, gqa, mqa, mla)", s.c_str());
}

bool KvShape::is_local_layer(int32_t layer) const {
  if (sliding_window <= 0) return false;
  if (swa_period <= 0) return true;
  return (layer + 1) % swa_period != 0;
}

int32_t KvShape::num_local_layers() const {
  if (sliding_window <= 0) return 0;
  if (swa_period <= 0) return num_layers;
  return num_layers - num_layers / swa_period;  // one global layer closes each full period
}

Status validate_kv_shape(const KvShape& s) {
  // 0: no attention layer (an attention-free model, mamba2: its K/V is none, its pool a token group's slot).
  if (s.num_layers < 0) return errorf("kv shape: num_layers must not be negative (got %d)", s.num_layers);
  if (s.sliding_window < 0 || s.swa_period < 0) {
    return errorf("kv shape: sliding_window (%d) and swa_period (%d) must be >= 0", s.sliding_window,
                  s.swa_period);
  }
  if (s.kind == AttentionKind::kMLA) {
    if (s.kv_lora_rank <= 0 || s.qk_rope_head_dim < 0) {
      return errorf("kv shape: MLA needs kv_lora_rank > 0 and qk_rope_head_dim >= 0 (got %d, %d)",
                    s.kv_lora_rank, s.qk_rope_head_dim);
    }
    return Status::Ok();
  }
  if (s.num_kv_heads <= 0 || s.head_dim <= 0 || s.v_head_dim < 0) {
    return errorf("kv shape: num_kv_heads (%d) and head_dim (%d) must be positive", s.num_kv_heads,
                  s.head_dim);
  }
  if (s.kind == AttentionKind::kMQA && s.num_kv_heads != 1) {
    return errorf("kv shape: MQA has exactly one KV head (got %d)", s.num_kv_heads);
  }
  return Status::Ok();
}

KvDtype kv_dtype_f32() { return {"f32", 1, 4}; }
KvDtype kv_dtype_f16() { return {"f16", 1, 2}; }
KvDtype kv_dtype_bf16() { return {"bf16", 1, 2}; }
KvDtype kv_dtype_fp8() { return {"fp8", 1, 1}; }
KvDtype kv_dtype_int8() { return {"int8", 1, 1}; }
KvDtype kv_dtype_q8_0() { return {"q8_0", 32, 34}; }
KvDtype kv_dtype_q4() { return {"q4", 32, 18}; }

KvDtype kv_dtype_of(pagoda::KvDtype d) {
  return {pagoda::kv_dtype_name(d), pagoda::kv_dtype_block_elems(d), pagoda::kv_dtype_block_bytes(d)};
}

KvDtype kv_dtype_pair(const KvDtype& k, const KvDtype& v) {
  KvDtype r = kv_k_dtype(k);
  const KvDtype vv = kv_k_dtype(v);
  if (std::string(r.name) == vv.name) return r;
  r.v_name = vv.name;
  r.v_block_elems = vv.block_elems;
  r.v_block_bytes = vv.block_bytes;
  return r;
}

KvDtype kv_dtype_of(pagoda::KvTypes t) { return kv_dtype_pair(kv_dtype_of(t.k), kv_dtype_of(t.v)); }

KvDtype kv_k_dtype(const KvDtype& d) { return {d.name, d.block_elems, d.block_bytes}; }
KvDtype kv_v_dtype(const KvDtype& d) {
  if (d.v_block_bytes <= 0) return kv_k_dtype(d);
  return {d.v_name != nullptr ? d.v_name : "?", d.v_block_elems, d.v_block_bytes};
}

std::string kv_dtype_label(const KvDtype& d) {
  std::string s = d.name;
  if (d.v_block_bytes > 0) s += std::string("/") + kv_v_dtype(d).name;
  return s;
}

Expected<KvDtype> parse_kv_dtype(const std::string& s) {
  if (const size_t slash = s.find('/'); slash != std::string::npos) {
    auto k = parse_kv_dtype(s.substr(0, slash));
    if (!k.ok()) return k;
    auto v = parse_kv_dtype(s.substr(slash + 1));
    if (!v.ok() || s.find('/', slash + 1) != std::string::npos)
      return errorf("unknown KV cache dtype '%s' (K/V: two of f32, f16, bf16, fp8, int8, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1)",
                    s.c_str());
    return kv_dtype_pair(*k, *v);
  }
  const std::string l = lower(s);
  for (pagoda::KvDtype d : {pagoda::KvDtype::Q4_0, pagoda::KvDtype::Q4_1, pagoda::KvDtype::IQ4_NL, pagoda::KvDtype::Q5_0,
                            pagoda::KvDtype::Q5_1})
    if (l == pagoda::kv_dtype_name(d)) return kv_dtype_of(d);
  if (l == "f32" || l == "fp32") return kv_dtype_f32();
  if (l == "f16" || l == "fp16") return kv_dtype_f16();
  if (l == "bf16") return kv_dtype_bf16();
  if (l == "fp8" || l == "fp8_e4m3" || l == "fp8_e5m2") return kv_dtype_fp8();
  if (l == "int8" || l == "i8") return kv_dtype_int8();
  if (l == "q8_0" || l == "q8") return kv_dtype_q8_0();
  if (l == "q4") return kv_dtype_q4();
  return errorf("unknown KV cache dtype '%s' (f32, f16, bf16, fp8, int8, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1)",
                s.c_str());
}

uint64_t kv_row_bytes(const KvDtype& d, int64_t n) {
  if (n <= 0) return 0;
  const uint64_t blocks = (static_cast<uint64_t>(n) + d.block_elems - 1) / d.block_elems;
  return blocks * static_cast<uint64_t>(d.block_bytes);
}

uint64_t kv_bytes_per_token_per_layer(const KvShape& s, const KvDtype& d) {
  if (s.kind == AttentionKind::kMLA) return kv_row_bytes(d, int64_t{s.kv_lora_rank} + s.qk_rope_head_dim);
  const int32_t v_dim = s.v_head_dim > 0 ? s.v_head_dim : s.head_dim;
  const uint64_t heads = static_cast<uint64_t>(std::max(s.num_kv_heads, 0));
  return heads * (kv_row_bytes(d, s.head_dim) + kv_row_bytes(kv_v_dtype(d), v_dim));
}

uint64_t kv_bytes_per_token(const KvShape& s, const KvDtype& d) {
  return static_cast<uint64_t>(std::max(s.num_layers, 0)) * kv_bytes_per_token_per_layer(s, d);
}

uint64_t kv_bytes_for_sequence(const KvShape& s, const KvDtype& d, int64_t num_tokens) {
  if (num_tokens <= 0) return 0;
  const uint64_t per_layer = kv_bytes_per_token_per_layer(s, d);
  const uint64_t local = static_cast<uint64_t>(std::max(s.num_local_layers(), 0));
  const uint64_t global = static_cast<uint64_t>(std::max(s.num_layers, 0)) - local;
  const uint64_t n = static_cast<uint64_t>(num_tokens);
  const uint64_t local_tokens = s.sliding_window > 0 ? std::min<uint64_t>(n, static_cast<uint64_t>(s.sliding_window)) : n;
  return per_layer * (global * n + local * local_tokens);
}

uint64_t kv_bytes_per_block(const KvShape& s, const KvDtype& d, int32_t block_size) {
  return static_cast<uint64_t>(std::max(block_size, 0)) * kv_bytes_per_token(s, d);
}

KvShape shard_for_tp(const KvShape& s, int32_t tp) {
  KvShape r = s;
  if (s.kind == AttentionKind::kMLA || tp <= 1) return r;
  r.num_kv_heads = std::max(1, (s.num_kv_heads + tp - 1) / tp);
  return r;
}

KvGroupLayout kv_group_layout(std::span<const int32_t> layer_windows, bool hybrid) {
  KvGroupLayout g;
  const auto n = static_cast<int32_t>(layer_windows.size());
  g.layer_group.assign(static_cast<size_t>(n), 0);
  g.layer_slot.assign(static_cast<size_t>(n), 0);
  // Kinds in order: full first, then windows ascending; each with its layers in
  // order. Recurrent layers (kStateWindow) are in none: they get the state group, last.
  std::vector<int32_t> kinds;
  for (int32_t w : layer_windows)
    if (w != kStateWindow) kinds.push_back(w);
  const auto n_attn = static_cast<int32_t>(kinds.size());
  std::sort(kinds.begin(), kinds.end());
  kinds.erase(std::unique(kinds.begin(), kinds.end()), kinds.end());
  if (!hybrid || kinds.size() <= 1) {
    // No attention layer at all (mamba2): one slot no layer uses, so the token
    // group (the prefix chain) and the state group's blocks have bytes to hold state rows.
    g.group_size = n_attn > 0 || n == 0 ? n_attn : 1;
    g.windows.push_back(hybrid && kinds.size() == 1 ? kinds[0] : 0);
    for (int32_t l = 0, slot = 0; l < n; ++l)
      if (layer_windows[static_cast<size_t>(l)] != kStateWindow) g.layer_slot[static_cast<size_t>(l)] = slot++;
  } else {
    int32_t gsize = n_attn;
    for (int32_t w : kinds) gsize = std::min(gsize, static_cast<int32_t>(std::count(layer_windows.begin(), layer_windows.end(), w)));
    g.group_size = gsize;
    for (int32_t w : kinds) {
      int32_t idx = 0;
      const auto base = static_cast<int32_t>(g.windows.size());
      for (int32_t l = 0; l < n; ++l) {
        if (layer_windows[static_cast<size_t>(l)] != w) continue;
        g.layer_group[static_cast<size_t>(l)] = base + idx / gsize;
        g.layer_slot[static_cast<size_t>(l)] = idx % gsize;
        ++idx;
      }
      for (int32_t k = 0; k < (idx + gsize - 1) / gsize; ++k) g.windows.push_back(w);
    }
  }
  if (n_attn < n) {  // the recurrent state group
    const auto state = static_cast<int32_t>(g.windows.size());
    g.windows.push_back(kStateWindow);
    for (int32_t l = 0; l < n; ++l) {
      if (layer_windows[static_cast<size_t>(l)] != kStateWindow) continue;
      g.layer_group[static_cast<size_t>(l)] = state;
      g.layer_slot[static_cast<size_t>(l)] = -1;
    }
  }
  return g;
}

std::vector<int32_t> kv_layer_windows(const KvShape& s) {
  std::vector<int32_t> w(static_cast<size_t>(std::max(s.num_layers, 0)), 0);
  for (int32_t l = 0; l < s.num_layers; ++l) w[static_cast<size_t>(l)] = s.is_local_layer(l) ? s.sliding_window : 0;
  return w;
}

int64_t kv_group_blocks_for_sequence(int64_t num_tokens, int32_t block_size, int32_t window, int32_t max_chunk) {
  if (num_tokens <= 0) return 0;
  const int64_t all = blocks_for_tokens(num_tokens, block_size);
  if (window <= 0) return all;
  // The last step's keys: L = window + chunk - 1 consecutive tokens, which
  // span at most ceil((L - 1) / bs) + 1 blocks.
  return std::min<int64_t>(all, blocks_for_tokens(int64_t{window} + std::max(max_chunk, 1) - 2, block_size) + 1);
}

int64_t kv_blocks_for_sequence(const KvGroupLayout& layout, int64_t num_tokens, int32_t block_size, int32_t max_chunk) {
  int64_t n = 0;
  for (int32_t w : layout.windows)
    n += w == kStateWindow ? (num_tokens > 0 ? layout.state_blocks : 0)
                           : kv_group_blocks_for_sequence(num_tokens, block_size, w, max_chunk);
  return n;
}

int64_t kv_state_rows_per_block(const KvShape& shape, const KvDtype& dtype, int32_t block_size, int32_t group_size,
                                uint64_t row_bytes) {
  if (row_bytes == 0 || block_size <= 0 || group_size <= 0) return 0;
  const int32_t v_dim = shape.v_head_dim > 0 ? shape.v_head_dim : shape.head_dim;
  const uint64_t heads = static_cast<uint64_t>(std::max(shape.num_kv_heads, 1));
  const uint64_t bs = static_cast<uint64_t>(block_size);
  const uint64_t k_chunk = bs * heads * kv_row_bytes(dtype, shape.head_dim);
  const uint64_t v_chunk = bs * heads * kv_row_bytes(kv_v_dtype(dtype), v_dim);
  return static_cast<int64_t>(static_cast<uint64_t>(group_size) * (k_chunk / row_bytes + v_chunk / row_bytes));
}

int32_t kv_state_blocks(int64_t n_rows, int64_t rows_per_block) {
  return n_rows <= 0 ? 0 : static_cast<int32_t>((n_rows + rows_per_block - 1) / rows_per_block);
}

uint64_t kv_group_bytes_per_block(const KvShape& shape, const KvDtype& dtype, int32_t block_size,
                                  const KvGroupLayout& layout) {
  return static_cast<uint64_t>(std::max(layout.group_size, 0)) * static_cast<uint64_t>(std::max(block_size, 0)) *
         kv_bytes_per_token_per_layer(shape, dtype);
}

int64_t num_blocks_for_budget(uint64_t budget_bytes, uint64_t bytes_per_block) {
  if (bytes_per_block == 0) return 0;
  return static_cast<int64_t>(budget_bytes / bytes_per_block);
}

int64_t watermark_blocks(int64_t num_blocks, double watermark_frac) {
  if (num_blocks <= 1 || !(watermark_frac > 0)) return 0;
  return static_cast<int64_t>(std::floor(watermark_frac * static_cast<double>(num_blocks - 1) + 1e-9));
}

int64_t usable_blocks(int64_t num_blocks, double watermark_frac) {
  return std::max<int64_t>(0, num_blocks - 1 - watermark_blocks(num_blocks, watermark_frac));
}

int64_t max_concurrency(int64_t num_blocks, int64_t blocks_per_request, double watermark_frac) {
  if (blocks_per_request <= 0) return 0;
  return usable_blocks(num_blocks, watermark_frac) / blocks_per_request;
}

}  // namespace pagoda::kv
