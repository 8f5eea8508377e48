// ref::short_conv (api.h): LFM2's gated causal depthwise convolution, scalar.
#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/api.h"

namespace pagoda::kernels::ref {

void short_conv(const float* bcx, int64_t n_tokens, int64_t n, const float* weight, int32_t l_cache,
                float* const* state, bool fresh, float* y) {
  const int64_t d = l_cache - 1;  // state rows
  // y first holds bx = B * x; the convolution then runs from the last token
  // back, so each y[t] is overwritten only after every later token read it.
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* b = bcx + t * 3 * n;
    const float* x = b + 2 * n;
    float* yt = y + t * n;
    for (int64_t c = 0; c < n; ++c) yt[c] = b[c] * x[c];
  }
  // The next state: the last d rows of [state; bx] (a zero row before position 0).
  thread_local std::vector<float> next;
  next.assign(static_cast<size_t>(d * n), 0.0f);
  for (int64_t j = 0; j < d; ++j) {
    const int64_t src = n_tokens - d + j;  // index into [state; bx], bx from 0
    float* dst = next.data() + j * n;
    if (src >= 0) std::memcpy(dst, y + src * n, static_cast<size_t>(n) * sizeof(float));
    else if (!fresh) std::memcpy(dst, state[d + src], static_cast<size_t>(n) * sizeof(float));
  }
  for (int64_t t = n_tokens - 1; t >= 0; --t) {
    const float* cg = bcx + t * 3 * n + n;
    float* yt = y + t * n;
    for (int64_t c = 0; c < n; ++c) {
      float sum = 0.0f;
      for (int64_t k = 0; k <= d; ++k) {
        const int64_t src = t + k - d;
        const float v = src >= 0 ? y[src * n + c] : fresh ? 0.0f : state[d + src][c];
        sum += v * weight[c * l_cache + k];
      }
      yt[c] = cg[c] * sum;
    }
  }
  for (int64_t j = 0; j < d; ++j) std::memcpy(state[j], next.data() + j * n, static_cast<size_t>(n) * sizeof(float));
}

}  // namespace pagoda::kernels::ref
