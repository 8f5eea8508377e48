// mamba2 (Mamba-2, state-space duality): every layer a selective-scan mixer, no
// attention and no feed-forward, as llama.cpp's src/models/mamba2.cpp and
// mamba-base.cpp (build_mamba2_layer) compute it. Every layer:
//   x += ssm_out(mixer(rmsnorm(x, attn_norm)))
// where the mixer is
//   z | xBC | dt = ssm_in(xn)          (d_inner | d_inner + 2 G N | H)
//   xBC = silu(conv1d(xBC) + conv1d.bias)  a causal depthwise convolution of
//         length ssm.conv_kernel whose previous conv_kernel - 1 rows are state
//         (kernels ssm_conv_silu)
//   y = scan(x, dt, A, B, C) + x * D   per head h of P = d_inner / H values
//         (kernels ssm_scan: dt_sp = softplus(dt + dt_bias), decay exp(dt_sp A),
//         state[h, i] = state * decay + B (x dt_sp), y = state . C), heads of a
//         group sharing its B and C (G = ssm.group_count)
//   y = rmsnorm_grouped(silu(z) * y, ssm_norm)  over G groups of d_inner / G
// The output is tied to token_embd unless output.weight exists.
//
// The recurrent state of one layer, f32 (base/recurrent_state.h's mamba2_state,
// the formula sizing uses too): the convolution's
// (conv_kernel - 1) x (d_inner + 2 G N) previous inputs, then the scan's H x P x N
// state, kept as rows of N = ssm.state_size floats in the sequence's state rows
// (the conv rows first, flat; then row h P + i of head h). Shapes whose conv
// state is not whole rows (d_inner % state_size != 0) are refused at load.
//
// Attention-free (ArchDef::attention_free): the KV pool has no attention layer;
// its token blocks (the prefix chain's) get one K/V "slot" one state row wide,
// which the state group's blocks use for state rows (kv/sizing.h).
// Not supported: mamba (v1), the hybrid falcon-h1 / granite-hybrid / nemotron-h.
#include <algorithm>
#include <string>
#include <vector>

#include "base/recurrent_state.h"
#include "model/arch.h"
#include "model/blocks.h"
#include "model/model.h"

namespace pagoda::model {

namespace {

Status read_hparams(const gguf::GgufFile& f, const std::string& p, ModelConfig& c) {
  PAGODA_ASSIGN_OR_RETURN(c.ssm_d_conv, read_required_int(f, p + "ssm.conv_kernel", 2, 64, "mamba2"));
  PAGODA_ASSIGN_OR_RETURN(c.ssm_d_inner, read_required_int(f, p + "ssm.inner_size", 1, int64_t{1} << 20, "mamba2"));
  PAGODA_ASSIGN_OR_RETURN(c.ssm_d_state, read_required_int(f, p + "ssm.state_size", 1, 1024, "mamba2"));
  PAGODA_ASSIGN_OR_RETURN(c.ssm_n_head, read_required_int(f, p + "ssm.time_step_rank", 1, 65536, "mamba2"));
  PAGODA_ASSIGN_OR_RETURN(c.ssm_n_group, read_required_int(f, p + "ssm.group_count", 1, 1024, "mamba2"));
  const int32_t Di = c.ssm_d_inner, N = c.ssm_d_state, H = c.ssm_n_head, G = c.ssm_n_group;
  if (Di % H != 0)
    return errorf("%sssm.inner_size %d must be a multiple of ssm.time_step_rank (heads) %d", p.c_str(), Di, H);
  if (H % G != 0) return errorf("%sssm.time_step_rank %d must be a multiple of ssm.group_count %d", p.c_str(), H, G);
  if (Di % N != 0)
    return errorf("%sssm.inner_size %d must be a multiple of ssm.state_size %d (the state is kept in rows of state_size "
                  "floats)", p.c_str(), Di, N);
  if (f.get_int_or(p + "attention.head_count", 0) != 0 || f.get_int_or(p + "feed_forward_length", 0) != 0)
    return errorf("%s: mamba2 with attention heads or a feed-forward (a hybrid such as falcon-h1) is not supported",
                  p.c_str());
  for (LayerAttn& a : c.layers) a.recurrent = true;
  // The KV pool's token blocks: one slot of one "head" one state row wide (model/config.h).
  c.n_heads = c.n_kv_heads = 1;
  c.head_dim = N;
  c.rope_dim = 0;
  c.n_ff = 0;
  const int64_t rows = mamba2_state(c.n_layers, c.ssm_d_conv, Di, G, N).rows;
  if (rows > (int64_t{1} << 30)) return errorf("%s: a recurrent state of %lld rows is too large", p.c_str(), static_cast<long long>(rows));
  c.n_state_rows = static_cast<int32_t>(rows);
  c.state_row_floats = N;
  // Workspace::conv per token: ssm_in's output, the conv input and output, the scan's y.
  const int32_t conv_dim = Di + 2 * G * N, d_in_proj = Di + conv_dim + H;
  c.scratch_floats = d_in_proj + 2 * conv_dim + Di;
  return Status::Ok();
}

Expected<ModelWeights> bind_weights(const gguf::GgufFile& f, const ModelConfig& c) {
  PAGODA_ASSIGN_OR_RETURN(ModelWeights w, bind_io_weights(f, c));
  w.layers.resize(static_cast<size_t>(c.n_layers));
  const auto Di = static_cast<uint64_t>(c.ssm_d_inner),
             H = static_cast<uint64_t>(c.ssm_n_head), G = static_cast<uint64_t>(c.ssm_n_group);
  const uint64_t conv_dim = Di + 2 * G * static_cast<uint64_t>(c.ssm_d_state);
  for (int32_t i = 0; i < c.n_layers; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    LayerWeights& l = w.layers[static_cast<size_t>(i)];
    PAGODA_ASSIGN_OR_RETURN(l.attn_norm, bind_vector(f, b + "attn_norm.weight", c.n_embd));
    PAGODA_ASSIGN_OR_RETURN(l.ssm_in, bind_matrix(f, b + "ssm_in.weight", static_cast<int64_t>(Di + conv_dim + H), c.n_embd));
    // GGUF dims {d_conv, conv_dim}: row c holds channel c's taps.
    PAGODA_ASSIGN_OR_RETURN(l.ssm_conv, bind_f32(f, b + "ssm_conv1d.weight", {static_cast<uint64_t>(c.ssm_d_conv), conv_dim}));
    PAGODA_ASSIGN_OR_RETURN(l.ssm_conv_b, bind_f32(f, b + "ssm_conv1d.bias", {conv_dim}));
    PAGODA_ASSIGN_OR_RETURN(l.ssm_dt, bind_f32(f, b + "ssm_dt.bias", {H}));
    PAGODA_ASSIGN_OR_RETURN(l.ssm_a, bind_f32(f, b + "ssm_a", {1, H}));
    PAGODA_ASSIGN_OR_RETURN(l.ssm_d, bind_f32(f, b + "ssm_d", {1, H}));
    PAGODA_ASSIGN_OR_RETURN(l.ssm_norm, bind_f32(f, b + "ssm_norm.weight", {Di / G, G}));
    PAGODA_ASSIGN_OR_RETURN(l.ssm_out, bind_matrix(f, b + "ssm_out.weight", c.n_embd, static_cast<int64_t>(Di)));
  }
  return w;
}

// x += ssm_out(mixer(rmsnorm(x))) for layer l, whose state rows start at
// l x (one layer's mamba2_state rows).
void mixer_block(const ForwardPass& p, int32_t l) {
  const ModelConfig& c = p.c;
  const LayerWeights& w = p.w.layers[static_cast<size_t>(l)];
  const int64_t T = p.batch.n_tokens, E = c.n_embd;
  const int32_t Di = c.ssm_d_inner, N = c.ssm_d_state, H = c.ssm_n_head, G = c.ssm_n_group;
  const int64_t conv_dim = Di + 2 * int64_t{G} * N, d_in_proj = Di + conv_dim + H;
  const auto conv_rows = static_cast<int32_t>((c.ssm_d_conv - 1) * conv_dim / N);
  const int64_t rows_per_layer = mamba2_state(1, c.ssm_d_conv, Di, G, N).rows;
  Workspace& ws = p.ws;
  float* x = ws.x.data();
  float* xn = ws.xn.data();
  float* zxbcdt = ws.conv.data();          // [T, d_in_proj] ssm_in output: z | xBC | dt
  float* xbc_in = zxbcdt + T * d_in_proj;  // [T, conv_dim] the conv input, contiguous
  float* xbc = xbc_in + T * conv_dim;      // [T, conv_dim] after the conv + silu: x | B | C
  float* y = xbc + T * conv_dim;           // [T, Di] the scan's output, then the normed mixer output
  rmsnorm_rows(p, x, w.attn_norm, T, E, xn);
  p.k.matmul(w.ssm_in, xn, T, zxbcdt);
  for (int64_t t = 0; t < T; ++t)
    std::copy_n(zxbcdt + t * d_in_proj + Di, conv_dim, xbc_in + t * conv_dim);
  const kernels::BatchView& b = p.batch;
  for (int32_t s = 0; s < b.n_seqs; ++s) {
    const int32_t t0 = b.q_indptr[s], n = b.q_indptr[s + 1] - t0;
    if (n == 0) continue;
    float* const* rows = b.state_rows + static_cast<int64_t>(s) * b.n_state_rows + l * rows_per_layer;
    const bool fresh = b.positions[t0] == 0;
    p.k.ssm_conv_silu(xbc_in + t0 * conv_dim, n, conv_dim, w.ssm_conv, c.ssm_d_conv, rows, N, fresh, xbc + t0 * conv_dim,
                      w.ssm_conv_b);
    kernels::Mamba2ScanArgs a;
    a.x = xbc + t0 * conv_dim;
    a.ld_x = conv_dim;
    a.B = a.x + Di;
    a.C = a.B + int64_t{G} * N;
    a.ld_bc = conv_dim;
    a.dt = zxbcdt + t0 * d_in_proj + Di + conv_dim;
    a.ld_dt = d_in_proj;
    a.dt_bias = w.ssm_dt;
    a.A = w.ssm_a;
    a.D = w.ssm_d;
    a.n_tokens = n;
    a.H = H;
    a.P = Di / H;
    a.N = N;
    a.G = G;
    a.state = rows + conv_rows;
    a.fresh = fresh;
    a.out = y + t0 * Di;
    a.ld_out = Di;
    p.k.ssm_scan(a);
  }
  // silu(z) * y into z's place, then the grouped RMSNorm back into y.
  const int64_t gs = Di / G;
  for (int64_t t = 0; t < T; ++t) {
    float* z = zxbcdt + t * d_in_proj;
    p.k.silu_mul(z, y + t * Di, Di);
    for (int64_t g = 0; g < G; ++g) p.k.rmsnorm(z + g * gs, w.ssm_norm + g * gs, c.rms_eps, 1, gs, y + t * Di + g * gs);
  }
  p.k.matmul(w.ssm_out, y, T, ws.proj.data());
  add_residual(p, nullptr, x, ws.proj.data(), T);
}

void forward(const ForwardPass& p) {
  embed_tokens(p);
  for (int32_t l = 0; l < p.c.n_layers; ++l) mixer_block(p, l);
  output_logits(p);
}

}  // namespace

extern const ArchDef kMamba2Arch;  // registry.cc
const ArchDef kMamba2Arch{.read_hparams = &read_hparams, .bind_weights = &bind_weights, .forward = &forward,
                          .recurrent_layers = true, .attention_free = true};

}  // namespace pagoda::model
