// Qwen3.5's recurrent ops (issue 38): ref::ssm_conv_silu against a naive loop
// (exact), ref::gated_delta_net against the matrix form of the gated delta rule,
// cpu::gated_delta_net (AVX2 and AVX-512) against ref, and the invariances the
// engine relies on: a sequence in chunks (state carried) is bitwise the sequence
// at once, and the thread count changes no bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "base/rng.h"
#include "kernels/api.h"
#include "kernels/backend.h"

namespace pagoda::kernels {
namespace {

std::vector<float> random_vec(Rng& rng, size_t n, float scale = 1.0f) {
  std::vector<float> v(n);
  for (float& f : v) f = scale * static_cast<float>(rng.uniform_int(-1000, 1000)) / 250.0f;
  return v;
}

// Row pointers of row_floats floats over a flat buffer.
struct Rows {
  Rows(std::vector<float>* s, int64_t row_floats) {
    for (size_t i = 0; i < s->size(); i += static_cast<size_t>(row_floats)) rows.push_back(s->data() + i);
  }
  std::vector<float*> rows;
};

// ---- ssm_conv_silu --------------------------------------------------------------

// pad = [state (or zeros); x]; y[t, c] = silu(sum_k w[c, k] pad[t + k, c]), the sum
// from 0.0f in k order; next state = last K - 1 rows of pad.
void naive_conv(const std::vector<float>& x, int64_t T, int64_t C, const std::vector<float>& w, int32_t K,
                const std::vector<float>& state, bool fresh, std::vector<float>* y, std::vector<float>* next) {
  const int64_t d = K - 1;
  std::vector<float> pad(static_cast<size_t>((d + T) * C), 0.0f);
  if (!fresh) std::copy(state.begin(), state.end(), pad.begin());
  std::copy(x.begin(), x.end(), pad.begin() + d * C);
  y->assign(static_cast<size_t>(T * C), 0.0f);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < C; ++c) {
      float s = 0.0f;
      for (int32_t k = 0; k < K; ++k) {
        volatile float prod = pad[(t + k) * C + c] * w[c * K + k];  // no fma (the kernels build with -ffp-contract=off)
        s += prod;
      }
      (*y)[t * C + c] = s / (1.0f + std::exp(-s));
    }
  }
  next->assign(pad.end() - d * C, pad.end());
}

TEST(SsmConvSilu, MatchesNaiveLoopExactly) {
  Rng rng(35);
  for (int32_t K : {2, 4}) {
    for (int64_t T : {1, 2, 3, 5, 17}) {
      for (bool fresh : {true, false}) {
        const int64_t C = 48, rf = 16, d = K - 1;  // state rows of 16 floats: 3 per time step
        const auto x = random_vec(rng, static_cast<size_t>(T * C));
        const auto w = random_vec(rng, static_cast<size_t>(C * K), 0.5f);
        const auto st0 = random_vec(rng, static_cast<size_t>(d * C));
        std::vector<float> want, want_state;
        naive_conv(x, T, C, w, K, st0, fresh, &want, &want_state);
        std::vector<float> st = st0, got(static_cast<size_t>(T * C), -1.0f);
        Rows rows(&st, rf);
        ref::ssm_conv_silu(x.data(), T, C, w.data(), K, rows.rows.data(), static_cast<int32_t>(rf), fresh, got.data(), nullptr);
        ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float))) << "K " << K << " T " << T << " fresh " << fresh;
        ASSERT_EQ(0, std::memcmp(st.data(), want_state.data(), st.size() * sizeof(float))) << "state: K " << K << " T " << T;
      }
    }
  }
  EXPECT_EQ(backend(BackendKind::Cpu).ssm_conv_silu, &ref::ssm_conv_silu);
  EXPECT_EQ(backend(BackendKind::Ref).ssm_conv_silu, &ref::ssm_conv_silu);
}

TEST(SsmConvSilu, ChunksCarryTheState) {
  Rng rng(8);
  const int32_t K = 4;
  const int64_t C = 32, T = 23, d = K - 1;
  const auto x = random_vec(rng, static_cast<size_t>(T * C));
  const auto w = random_vec(rng, static_cast<size_t>(C * K), 0.5f);
  std::vector<float> whole_state(static_cast<size_t>(d * C), 9.0f), whole(static_cast<size_t>(T * C));
  Rows wr(&whole_state, 8);
  ref::ssm_conv_silu(x.data(), T, C, w.data(), K, wr.rows.data(), 8, /*fresh=*/true, whole.data(), nullptr);
  for (int64_t chunk : {1, 2, 3, 8}) {
    std::vector<float> st(static_cast<size_t>(d * C), -3.0f), y(static_cast<size_t>(T * C));
    Rows rows(&st, 8);
    for (int64_t t0 = 0; t0 < T; t0 += chunk) {
      const int64_t m = std::min(chunk, T - t0);
      ref::ssm_conv_silu(x.data() + t0 * C, m, C, w.data(), K, rows.rows.data(), 8, t0 == 0, y.data() + t0 * C, nullptr);
    }
    ASSERT_EQ(0, std::memcmp(y.data(), whole.data(), y.size() * sizeof(float))) << "chunk " << chunk;
    ASSERT_EQ(0, std::memcmp(st.data(), whole_state.data(), st.size() * sizeof(float))) << "chunk " << chunk;
  }
}

// ---- gated_delta_net ------------------------------------------------------------

struct DeltaCase {
  int32_t T, S, Hk, Hv;
  std::vector<float> qkv, alpha, beta, dt, a, state0;
  GatedDeltaNetArgs args(std::vector<float>* state, std::vector<float*>* rows, bool fresh, float* out, int32_t t0 = 0,
                         int32_t n = -1) const {
    rows->clear();
    for (int64_t r = 0; r < int64_t{Hv} * S; ++r) rows->push_back(state->data() + r * S);
    GatedDeltaNetArgs g;
    const int64_t ld = int64_t{2 * Hk + Hv} * S;
    g.qkv = qkv.data() + t0 * ld;
    g.ld = ld;
    g.alpha = alpha.data() + t0 * Hv;
    g.beta = beta.data() + t0 * Hv;
    g.ld_ab = Hv;
    g.dt_bias = dt.data();
    g.ssm_a = a.data();
    g.n_tokens = n < 0 ? T : n;
    g.S = S;
    g.H_k = Hk;
    g.H_v = Hv;
    g.eps = 1e-6f;
    g.state = rows->data();
    g.fresh = fresh;
    g.out = out + int64_t{t0} * Hv * S;
    return g;
  }
};

DeltaCase make_case(Rng& rng, int32_t T, int32_t S, int32_t Hk, int32_t Hv) {
  DeltaCase c{T, S, Hk, Hv, {}, {}, {}, {}, {}, {}};
  c.qkv = random_vec(rng, static_cast<size_t>(T) * (2 * Hk + Hv) * S, 0.25f);
  c.alpha = random_vec(rng, static_cast<size_t>(T) * Hv);
  c.beta = random_vec(rng, static_cast<size_t>(T) * Hv);
  c.dt = random_vec(rng, static_cast<size_t>(Hv), 0.25f);
  for (int32_t h = 0; h < Hv; ++h) c.a.push_back(-0.05f - 0.5f * static_cast<float>(h));
  c.state0 = random_vec(rng, static_cast<size_t>(Hv) * S * S, 0.1f);
  return c;
}

// The gated delta rule in its matrix form (HF's torch_recurrent_gated_delta_rule),
// in double: S_h (k x v) *= exp(g); kv = S^T k; S += k (beta (v - kv))^T; o = S^T q / sqrt(S).
void matrix_form(const DeltaCase& c, bool fresh, std::vector<double>* out, std::vector<double>* state) {
  const int64_t S = c.S, Hk = c.Hk, Hv = c.Hv, ld = (2 * Hk + Hv) * S;
  out->assign(static_cast<size_t>(c.T * Hv * S), 0.0);
  state->assign(static_cast<size_t>(Hv * S * S), 0.0);  // [h][i (k)][j (v)]
  for (int64_t h = 0; h < Hv; ++h)
    for (int64_t j = 0; j < S; ++j)
      for (int64_t i = 0; i < S; ++i)
        (*state)[(h * S + i) * S + j] = fresh ? 0.0 : c.state0[(h * S + j) * S + i];  // rows are columns
  for (int64_t t = 0; t < c.T; ++t) {
    for (int64_t h = 0; h < Hv; ++h) {
      const int64_t hk = h % Hk;
      std::vector<double> q(S), k(S);
      double qs = 0, ks = 0;
      for (int64_t i = 0; i < S; ++i) {
        q[i] = c.qkv[t * ld + hk * S + i];
        k[i] = c.qkv[t * ld + (Hk + hk) * S + i];
        qs += q[i] * q[i];
        ks += k[i] * k[i];
      }
      for (int64_t i = 0; i < S; ++i) {
        q[i] /= std::sqrt(qs + 1e-6);
        k[i] /= std::sqrt(ks + 1e-6);
      }
      const double x = c.alpha[t * Hv + h] + c.dt[h];
      const double g = (x > 20 ? x : std::log1p(std::exp(x))) * c.a[h];
      const double beta = 1.0 / (1.0 + std::exp(-static_cast<double>(c.beta[t * Hv + h])));
      double* M = state->data() + h * S * S;
      for (int64_t e = 0; e < S * S; ++e) M[e] *= std::exp(g);
      for (int64_t j = 0; j < S; ++j) {
        double kv = 0;
        for (int64_t i = 0; i < S; ++i) kv += M[i * S + j] * k[i];
        const double d = (c.qkv[t * ld + 2 * Hk * S + h * S + j] - kv) * beta;
        for (int64_t i = 0; i < S; ++i) M[i * S + j] += k[i] * d;
      }
      for (int64_t j = 0; j < S; ++j) {
        double o = 0;
        for (int64_t i = 0; i < S; ++i) o += M[i * S + j] * q[i];
        (*out)[(t * Hv + h) * S + j] = o / std::sqrt(static_cast<double>(S));
      }
    }
  }
}

float max_abs_diff(const float* a, const float* b, size_t n) {
  float m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

TEST(GatedDeltaNet, RefMatchesTheMatrixForm) {
  Rng rng(3);
  for (const auto& [T, S, Hk, Hv] : {std::tuple{1, 16, 2, 4}, std::tuple{7, 16, 2, 2}, std::tuple{5, 32, 1, 3}}) {
    for (bool fresh : {true, false}) {
      const DeltaCase c = make_case(rng, T, S, Hk, Hv);
      std::vector<float> state = c.state0, out(static_cast<size_t>(T) * Hv * S);
      std::vector<float*> rows;
      ref::gated_delta_net(c.args(&state, &rows, fresh, out.data()));
      std::vector<double> want, want_state;
      matrix_form(c, fresh, &want, &want_state);
      for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], want[i], 2e-5 + 2e-5 * std::fabs(want[i])) << i;
      for (int64_t h = 0; h < Hv; ++h)
        for (int64_t j = 0; j < S; ++j)
          for (int64_t i = 0; i < S; ++i) {
            const double w = want_state[static_cast<size_t>((h * S + i) * S + j)];
            ASSERT_NEAR(state[static_cast<size_t>((h * S + j) * S + i)], w, 2e-5 + 2e-5 * std::fabs(w));
          }
    }
  }
  EXPECT_EQ(backend(BackendKind::Ref).gated_delta_net, &ref::gated_delta_net);
  EXPECT_EQ(backend(BackendKind::Cpu).gated_delta_net, &cpu::gated_delta_net);
}

// cpu:: on each ISA against ref: the same operations up to the sums' order and
// fused multiply-adds, so within float rounding of the 128-term dot products.
TEST(GatedDeltaNet, CpuMatchesRefOnEachIsa) {
  Rng rng(11);
  for (const char* isa : {"avx2", "avx512-vnni"}) {
    if (!cpu::set_isa(isa)) continue;  // no AVX-512 on this machine
    for (const auto& [T, S, Hk, Hv] : {std::tuple{1, 128, 4, 4}, std::tuple{9, 16, 2, 4}, std::tuple{3, 32, 2, 2},
                                       std::tuple{2, 24, 1, 1}}) {
      for (bool fresh : {true, false}) {
        const DeltaCase c = make_case(rng, T, S, Hk, Hv);
        std::vector<float> s_ref = c.state0, s_cpu = c.state0;
        std::vector<float> o_ref(static_cast<size_t>(T) * Hv * S), o_cpu(o_ref.size());
        std::vector<float*> r1, r2;
        ref::gated_delta_net(c.args(&s_ref, &r1, fresh, o_ref.data()));
        cpu::gated_delta_net(c.args(&s_cpu, &r2, fresh, o_cpu.data()));
        EXPECT_LT(max_abs_diff(o_ref.data(), o_cpu.data(), o_ref.size()), 2e-5f) << isa << " S " << S << " T " << T;
        EXPECT_LT(max_abs_diff(s_ref.data(), s_cpu.data(), s_ref.size()), 2e-5f) << isa << " S " << S << " T " << T;
        // Not the very same bits when the vector path ran (S % 8 == 0): the test sees that path.
        if (S % 8 == 0 && T > 1) {
          EXPECT_NE(0, std::memcmp(o_ref.data(), o_cpu.data(), o_ref.size() * sizeof(float))) << isa;
        }
      }
    }
  }
  cpu::set_isa("auto");
}

// Chunked (state carried), and 1 vs 2 threads: bitwise the whole sequence at once.
TEST(GatedDeltaNet, ChunksAndThreadsChangeNoBit) {
  Rng rng(5);
  const DeltaCase c = make_case(rng, 13, 64, 2, 4);
  const int saved_threads = num_threads();
  for (const auto kernel : {&ref::gated_delta_net, &cpu::gated_delta_net}) {
    for (const char* isa : {"avx2", "avx512-vnni"}) {
      if (!cpu::set_isa(isa)) continue;
      std::vector<float> ws = c.state0, whole(static_cast<size_t>(c.T) * c.Hv * c.S);
      std::vector<float*> rows;
      set_num_threads(1);
      kernel(c.args(&ws, &rows, true, whole.data()));
      for (int threads : {1, 2}) {
        set_num_threads(threads);
        for (int32_t chunk : {1, 4, 13}) {
          std::vector<float> st(c.state0.size(), 77.0f), out(whole.size());
          for (int32_t t0 = 0; t0 < c.T; t0 += chunk) {
            const int32_t n = std::min(chunk, c.T - t0);
            kernel(c.args(&st, &rows, t0 == 0, out.data(), t0, n));
          }
          ASSERT_EQ(0, std::memcmp(out.data(), whole.data(), out.size() * sizeof(float))) << isa << " chunk " << chunk;
          ASSERT_EQ(0, std::memcmp(st.data(), ws.data(), st.size() * sizeof(float))) << isa << " chunk " << chunk;
        }
      }
    }
  }
  cpu::set_isa("auto");
  set_num_threads(saved_threads);
}

}  // namespace
}  // namespace pagoda::kernels
