// ref::short_conv (LFM2's gated short convolution) against a naive loop over the
// padded sequence [state; B*x]: exact, for several lengths, fresh and carried
// states, and split into chunks (the state carries the sequence across them).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "base/rng.h"
#include "kernels/api.h"
#include "kernels/backend.h"

namespace pagoda::kernels {
namespace {

std::vector<float> random_vec(Rng& rng, size_t n) {
  std::vector<float> v(n);
  for (float& f : v) f = static_cast<float>(rng.uniform_int(-1000, 1000)) / 250.0f;
  return v;
}

// The definition: pad = [state rows (or zeros); bx rows], y[t, c] = C[t, c] *
// sum_k w[c, k] * pad[t + k, c], the sum from 0.0f in k order.
void naive(const std::vector<float>& bcx, int64_t T, int64_t n, const std::vector<float>& w, int32_t L,
           const std::vector<float>& state, bool fresh, std::vector<float>* y, std::vector<float>* next_state) {
  const int64_t d = L - 1;
  std::vector<float> pad(static_cast<size_t>((d + T) * n), 0.0f);
  if (!fresh) std::memcpy(pad.data(), state.data(), state.size() * sizeof(float));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < n; ++c) pad[(d + t) * n + c] = bcx[t * 3 * n + c] * bcx[t * 3 * n + 2 * n + c];
  y->assign(static_cast<size_t>(T * n), 0.0f);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < n; ++c) {
      float s = 0.0f;
      for (int32_t k = 0; k < L; ++k) {
        // volatile: no fused multiply-add here (the kernels build with -ffp-contract=off; this test does not).
        volatile float prod = pad[(t + k) * n + c] * w[c * L + k];
        s += prod;
      }
      (*y)[t * n + c] = bcx[t * 3 * n + n + c] * s;
    }
  }
  next_state->assign(pad.end() - d * n, pad.end());
}

struct StateRows {
  explicit StateRows(std::vector<float>* s, int64_t d, int64_t n) {
    for (int64_t j = 0; j < d; ++j) rows.push_back(s->data() + j * n);
  }
  std::vector<float*> rows;
};

TEST(ShortConv, MatchesNaiveLoopExactly) {
  Rng rng(38);
  for (int32_t L : {2, 3, 4}) {
    for (int64_t T : {1, 2, 3, 7, 33}) {
      for (bool fresh : {true, false}) {
        const int64_t n = 24, d = L - 1;
        const auto bcx = random_vec(rng, static_cast<size_t>(T * 3 * n));
        const auto w = random_vec(rng, static_cast<size_t>(n * L));
        const auto st0 = random_vec(rng, static_cast<size_t>(d * n));
        std::vector<float> want, want_state;
        naive(bcx, T, n, w, L, st0, fresh, &want, &want_state);
        std::vector<float> st = st0, got(static_cast<size_t>(T * n), -1.0f);
        StateRows rows(&st, d, n);
        ref::short_conv(bcx.data(), T, n, w.data(), L, rows.rows.data(), fresh, got.data());
        ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)))
            << "L " << L << " T " << T << " fresh " << fresh;
        ASSERT_EQ(0, std::memcmp(st.data(), want_state.data(), st.size() * sizeof(float)))
            << "state: L " << L << " T " << T << " fresh " << fresh;
        // Both backends' tables call this very op.
        EXPECT_EQ(backend(BackendKind::Cpu).short_conv, &ref::short_conv);
        EXPECT_EQ(backend(BackendKind::Ref).short_conv, &ref::short_conv);
      }
    }
  }
}

// A sequence computed in chunks (the state carried between them) is bitwise the
// sequence computed at once: chunked prefill and decode see the same values.
TEST(ShortConv, ChunksCarryTheState) {
  Rng rng(7);
  const int32_t L = 3;
  const int64_t n = 16, T = 20, d = L - 1;
  const auto bcx = random_vec(rng, static_cast<size_t>(T * 3 * n));
  const auto w = random_vec(rng, static_cast<size_t>(n * L));
  std::vector<float> whole_state(static_cast<size_t>(d * n), 123.0f), whole(static_cast<size_t>(T * n));
  StateRows wr(&whole_state, d, n);
  ref::short_conv(bcx.data(), T, n, w.data(), L, wr.rows.data(), /*fresh=*/true, whole.data());
  for (int64_t chunk : {1, 2, 3, 7}) {
    std::vector<float> st(static_cast<size_t>(d * n), -5.0f), y(static_cast<size_t>(T * n));
    StateRows rows(&st, d, n);
    for (int64_t t0 = 0; t0 < T; t0 += chunk) {
      const int64_t m = std::min(chunk, T - t0);
      ref::short_conv(bcx.data() + t0 * 3 * n, m, n, w.data(), L, rows.rows.data(), t0 == 0, y.data() + t0 * n);
    }
    ASSERT_EQ(0, std::memcmp(y.data(), whole.data(), y.size() * sizeof(float))) << "chunk " << chunk;
    ASSERT_EQ(0, std::memcmp(st.data(), whole_state.data(), st.size() * sizeof(float))) << "chunk " << chunk;
  }
}

}  // namespace
}  // namespace pagoda::kernels
