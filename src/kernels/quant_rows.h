// Internal to kernels/: scalar row (de)quantizers shared by ref/ and cpu/.
// Layouts and rounding follow ggml's reference code (ggml-quants.c) exactly.
#pragma once
#include <cstdint>

#include "kernels/api.h"

namespace pagoda::kernels::detail {

// q8_0 like ggml's quantize_row_q8_0_ref: per 32 values d = amax / 127 (stored
// as f16), q = roundf(x / d). Precondition: n % 32 == 0. out: [n / 32 * 34] bytes
void quantize_row_q8_0(const float* x, int64_t n, uint8_t* out);

// f32 -> KV row in dtype (q8_0 as above). out: kv_row_bytes(dtype, n) bytes
void kv_encode_row(KvDtype dtype, const float* x, int64_t n, uint8_t* out);

// Q4_K / Q5_K 6-bit scale and min of sub-block j (0..7) of a super-block.
inline void k_scale_min(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

}  // namespace pagoda::kernels::detail
