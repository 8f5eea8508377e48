// Test helper of the load-time packed K-quants (test_kpack.cc, test_kquant.cc):
// a random weight and its packed copy (kernels::pack_weight).
#pragma once
#include <cstdint>

#include "base/aligned.h"
#include "kernels/backend.h"
#include "kernels/kernel_test_util.h"

namespace pagoda::kernels::testing {

// A weight and its packed copy (view.packed set).
struct KPacked {
  testing::RandomWeight src;
  AlignedBuffer<uint8_t> copy;
  WeightView view;
};

// (Re)packs k.src into k.copy and points k.view at both.
inline void repack(KPacked& k) {
  k.copy.resize(packed_weight_bytes(k.src.view));
  if (k.copy.size() != 0) pack_weight(k.src.view, k.copy.data());
  k.view = k.src.view;
  k.view.packed = k.copy.data();
}

inline KPacked make_packed(GgmlType type, int64_t rows, int64_t cols, uint64_t seed) {
  KPacked k{make_weight(type, rows, cols, seed), {}, {}};
  repack(k);
  return k;
}

}  // namespace pagoda::kernels::testing
