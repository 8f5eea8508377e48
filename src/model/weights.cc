#include "model/weights.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

#include "base/ggml_quant.h"
#include "kernels/backend.h"
#include "model/arch.h"

namespace pagoda::model {

namespace {

std::string dims_str(const std::vector<uint64_t>& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(d[i]);
  }
  return s + "]";
}

// Finds `name` and checks its GGUF dims (ggml order: dims[0] is the row length).
Expected<const gguf::TensorInfo*> find_shaped(const gguf::GgufFile& f, const std::string& name,
                                              const std::vector<uint64_t>& want) {
  const gguf::TensorInfo* t = f.find_tensor(name);
  if (!t) return errorf("tensor %s: missing (expected shape %s)", name.c_str(), dims_str(want).c_str());
  if (t->dims != want) {
    return errorf("tensor %s: expected %s, found %s", name.c_str(), dims_str(want).c_str(),
                  dims_str(t->dims).c_str());
  }
  if (!t->data) return errorf("tensor %s: no data", name.c_str());
  return t;
}

}  // namespace

Expected<const float*> bind_vector(const gguf::GgufFile& f, const std::string& name, int64_t n) {
  PAGODA_ASSIGN_OR_RETURN(const gguf::TensorInfo* t, find_shaped(f, name, {static_cast<uint64_t>(n)}));
  if (t->type != GgmlType::F32) {
    const GgmlTypeInfo* ti = ggml_type_info(static_cast<uint32_t>(t->type));
    return errorf("tensor %s: type %s not supported for norms/biases (need F32)", name.c_str(),
                  ti ? ti->name : "?");
  }
  if (reinterpret_cast<uintptr_t>(t->data) % alignof(float) != 0) {
    return errorf("tensor %s: data not 4-byte aligned", name.c_str());
  }
  return reinterpret_cast<const float*>(t->data);
}

Expected<const float*> bind_f32(const gguf::GgufFile& f, const std::string& name, std::vector<uint64_t> dims) {
  const gguf::TensorInfo* t = f.find_tensor(name);
  std::string want;
  for (uint64_t d : dims) want += (want.empty() ? "" : ", ") + std::to_string(d);
  if (!t) return errorf("tensor %s: missing (expected [%s])", name.c_str(), want.c_str());
  std::vector<uint64_t> have = t->dims;
  while (have.size() > 1 && have.back() == 1) have.pop_back();
  while (dims.size() > 1 && dims.back() == 1) dims.pop_back();
  if (have != dims) return errorf("tensor %s: expected [%s]", name.c_str(), want.c_str());
  if (t->type != GgmlType::F32) return errorf("tensor %s: must be F32", name.c_str());
  if (!t->data || reinterpret_cast<uintptr_t>(t->data) % alignof(float) != 0)
    return errorf("tensor %s: no data or not 4-byte aligned", name.c_str());
  return reinterpret_cast<const float*>(t->data);
}

// GGUF dims [cols, rows].
Expected<kernels::WeightView> bind_matrix(const gguf::GgufFile& f, const std::string& name, int64_t rows,
                                          int64_t cols) {
  PAGODA_ASSIGN_OR_RETURN(const gguf::TensorInfo* t,
                          find_shaped(f, name, {static_cast<uint64_t>(cols), static_cast<uint64_t>(rows)}));
  const GgmlTypeInfo* ti = ggml_type_info(static_cast<uint32_t>(t->type));
  if (!ti || !kernels::matmul_supports(t->type)) {
    return errorf("tensor %s: type %s is not supported", name.c_str(), ti ? ti->name : "unknown");
  }
  if (cols % ti->block_size != 0) {
    return errorf("tensor %s: row length %lld is not a multiple of the %s block size %u", name.c_str(),
                  static_cast<long long>(cols), ti->name, ti->block_size);
  }
  kernels::WeightView w;
  w.data = t->data;
  w.type = t->type;
  w.rows = rows;
  w.cols = cols;
  w.row_bytes = ggml_row_bytes(t->type, static_cast<size_t>(cols));
  if (w.row_bytes * static_cast<uint64_t>(rows) > t->n_bytes) {
    return errorf("tensor %s: %llu bytes, expected %llu", name.c_str(), static_cast<unsigned long long>(t->n_bytes),
                  static_cast<unsigned long long>(w.row_bytes * static_cast<uint64_t>(rows)));
  }
  return w;
}

namespace {

uint64_t matrix_bytes(const kernels::WeightView& w) { return w.row_bytes * static_cast<uint64_t>(w.rows); }

}  // namespace

Expected<ModelWeights> bind_io_weights(const gguf::GgufFile& f, const ModelConfig& c) {
  ModelWeights w;
  PAGODA_ASSIGN_OR_RETURN(w.token_embd, bind_matrix(f, "token_embd.weight", c.n_vocab, c.n_embd));
  if (!dequantize_supported(w.token_embd.type)) {
    return errorf("tensor token_embd.weight: type %s cannot be dequantized", ggml_type_info(w.token_embd.type).name);
  }
  PAGODA_ASSIGN_OR_RETURN(w.output_norm, bind_vector(f, "output_norm.weight", c.n_embd));
  if (c.tied_output) {
    w.output = w.token_embd;
  } else {
    PAGODA_ASSIGN_OR_RETURN(w.output, bind_matrix(f, "output.weight", c.n_vocab, c.n_embd));
  }
  return w;
}

Expected<ModelWeights> bind_decoder_weights(const gguf::GgufFile& f, const ModelConfig& c) {
  PAGODA_ASSIGN_OR_RETURN(ModelWeights w, bind_io_weights(f, c));
  w.layers.resize(static_cast<size_t>(c.n_layers));
  for (int32_t i = 0; i < c.n_layers; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    LayerWeights& l = w.layers[static_cast<size_t>(i)];
    PAGODA_ASSIGN_OR_RETURN(l.attn_norm, bind_vector(f, b + "attn_norm.weight", c.n_embd));
    PAGODA_ASSIGN_OR_RETURN(l.wq, bind_matrix(f, b + "attn_q.weight", c.q_dim(), c.n_embd));
    PAGODA_ASSIGN_OR_RETURN(l.wk, bind_matrix(f, b + "attn_k.weight", c.kv_dim(), c.n_embd));
    PAGODA_ASSIGN_OR_RETURN(l.wv, bind_matrix(f, b + "attn_v.weight", c.kv_dim(), c.n_embd));
    PAGODA_ASSIGN_OR_RETURN(l.wo, bind_matrix(f, b + "attn_output.weight", c.n_embd, c.q_dim()));
    PAGODA_ASSIGN_OR_RETURN(l.ffn_norm, bind_vector(f, b + "ffn_norm.weight", c.n_embd));
    PAGODA_ASSIGN_OR_RETURN(l.w_gate, bind_matrix(f, b + "ffn_gate.weight", c.n_ff, c.n_embd));
    PAGODA_ASSIGN_OR_RETURN(l.w_up, bind_matrix(f, b + "ffn_up.weight", c.n_ff, c.n_embd));
    PAGODA_ASSIGN_OR_RETURN(l.w_down, bind_matrix(f, b + "ffn_down.weight", c.n_embd, c.n_ff));
  }
  return w;
}

Status bind_qk_norms(const gguf::GgufFile& f, const ModelConfig& c, ModelWeights& w) {
  for (int32_t i = 0; i < c.n_layers; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    LayerWeights& l = w.layers[static_cast<size_t>(i)];
    PAGODA_ASSIGN_OR_RETURN(l.q_norm, bind_vector(f, b + "attn_q_norm.weight", c.head_dim));
    PAGODA_ASSIGN_OR_RETURN(l.k_norm, bind_vector(f, b + "attn_k_norm.weight", c.head_dim));
  }
  return Status::Ok();
}

Expected<const float*> bind_rope_factors(const gguf::GgufFile& f, const std::string& name, const ModelConfig& c) {
  PAGODA_ASSIGN_OR_RETURN(const float* v, bind_vector(f, name, c.rope_dim / 2));
  for (int32_t i = 0; i < c.rope_dim / 2; ++i) {
    if (!(v[i] > 0.f) || !std::isfinite(v[i])) {
      return errorf("tensor %s: factor %d is %g (must be positive and finite)", name.c_str(), i, static_cast<double>(v[i]));
    }
  }
  return v;
}

kernels::WeightView row_slice(const kernels::WeightView& w, int64_t row0, int64_t rows) {
  kernels::WeightView s = w;
  s.packed = nullptr;  // slices are bound before packing; a packed copy is per view
  s.data = static_cast<const uint8_t*>(w.data) + static_cast<size_t>(row0) * w.row_bytes;
  s.rows = rows;
  return s;
}

uint64_t weight_bytes_per_token(const ModelWeights& w, const ModelConfig& c) {
  const uint64_t vec = static_cast<uint64_t>(c.n_embd) * 4;
  uint64_t total = w.token_embd.row_bytes + vec + matrix_bytes(w.output);
  for (const LayerWeights& l : w.layers) {
    total += 2 * vec + matrix_bytes(l.wq) + matrix_bytes(l.wk) + matrix_bytes(l.wv) + matrix_bytes(l.wo) +
             matrix_bytes(l.w_gate) + matrix_bytes(l.w_up) + matrix_bytes(l.w_down);
    if (l.bq) total += 4 * static_cast<uint64_t>(c.q_dim() + 2 * c.kv_dim());
    if (l.q_norm) total += 2 * 4 * static_cast<uint64_t>(c.head_dim);
    if (l.post_attn_norm) total += 2 * vec;
    if (l.conv_w) total += matrix_bytes(l.conv_in) + matrix_bytes(l.conv_out) + vec * static_cast<uint64_t>(c.shortconv_l_cache);
    if (l.ssm_in.data)  // mamba2
      total += matrix_bytes(l.ssm_in) + matrix_bytes(l.ssm_out) +
               4 * static_cast<uint64_t>((c.ssm_d_inner + 2 * c.ssm_n_group * c.ssm_d_state) * (c.ssm_d_conv + 1) +
                                         3 * c.ssm_n_head + c.ssm_d_inner);
    else if (l.ssm_conv)
      total += matrix_bytes(l.ssm_qkv) + matrix_bytes(l.ssm_gate) + matrix_bytes(l.ssm_alpha) + matrix_bytes(l.ssm_beta) +
               matrix_bytes(l.ssm_out) +
               4 * static_cast<uint64_t>(c.ssm_conv_dim() * c.ssm_d_conv + 2 * c.ssm_n_v_heads + c.ssm_d_state);
  }
  return total;
}

void pack_decode_weights(const gguf::GgufFile& file, ModelWeights& w) {
  if (const char* env = std::getenv("PAGODA_PACK"); env != nullptr && std::strcmp(env, "0") == 0) return;
  std::vector<kernels::WeightView*> views = {&w.output};
  if (w.token_embd.data == w.output.data) views.push_back(&w.token_embd);  // tied: same copy
  for (LayerWeights& l : w.layers)
    for (kernels::WeightView* v : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down, &l.conv_in, &l.conv_out, &l.ssm_qkv,
                                     &l.ssm_gate, &l.ssm_alpha, &l.ssm_beta, &l.ssm_out, &l.ssm_in})
      views.push_back(v);
  // One copy per distinct matrix (same data, shape and type), 64-byte aligned offsets.
  std::map<const void*, size_t> offset;
  std::vector<kernels::WeightView*> first;  // the view each copy is packed from
  size_t total = 0;
  for (kernels::WeightView* v : views) {
    const size_t n = v->data ? kernels::packed_weight_bytes(*v) : 0;
    if (n == 0 || offset.count(v->data)) continue;
    offset[v->data] = total;
    first.push_back(v);
    total += (n + 63) / 64 * 64;
  }
  if (total == 0) return;
  auto packed = std::make_shared<PackedWeights>(total);
  const long page = ::sysconf(_SC_PAGESIZE);
  for (kernels::WeightView* v : first) {
    kernels::pack_weight(*v, packed->buf.data() + offset[v->data]);
    ++packed->matrices;
    if (!file.mapped() || page <= 0) continue;
    // Whole pages inside the matrix only (neighbouring tensors keep theirs).
    const auto p = reinterpret_cast<uintptr_t>(v->data), pg = static_cast<uintptr_t>(page);
    const uintptr_t lo = (p + pg - 1) / pg * pg, hi = (p + matrix_bytes(*v)) / pg * pg;
    if (hi > lo && ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED) == 0) packed->released_bytes += hi - lo;
  }
  for (kernels::WeightView* v : views) {
    const auto it = offset.find(v->data);
    if (it == offset.end()) continue;
    for (const kernels::WeightView* f : first)  // only a view of the very matrix packed
      if (f->data == v->data && f->type == v->type && f->rows == v->rows && f->cols == v->cols)
        v->packed = packed->buf.data() + it->second;
  }
  w.packed = std::move(packed);
}

}  // namespace pagoda::model
