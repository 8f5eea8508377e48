// Checks a parsed model::ModelConfig against the fields a test names (the
// others are not checked): the model tests and the prefix tests each pin the
// shape of the model they load. A failure names the field.
#pragma once
#include <gtest/gtest.h>

#include <optional>

#include "model/config.h"

namespace pagoda::testutil {

// The ModelConfig fields a test may pin, each compared exactly (floats with
// EXPECT_FLOAT_EQ).
#define PAGODA_CONFIG_CHECKED_FIELDS(X)                                                                 \
  X(arch) X(n_layers) X(n_embd) X(n_ff) X(n_heads) X(n_kv_heads) X(head_dim) X(rope_dim) X(n_vocab) \
  X(n_ctx_train) X(rope_base) X(rope_neox) X(tied_output) X(qk_norm) X(post_norms)

// Designated initializers in ModelConfig's field order; a field left out is not checked.
struct ConfigWant {
#define PAGODA_CONFIG_WANT_FIELD(f) std::optional<decltype(model::ModelConfig::f)> f{};
  PAGODA_CONFIG_CHECKED_FIELDS(PAGODA_CONFIG_WANT_FIELD)
#undef PAGODA_CONFIG_WANT_FIELD
};

template <class T>
void expect_field(const char* field, const T& got, const T& want) {
  EXPECT_EQ(got, want) << "ModelConfig::" << field;
}
inline void expect_field(const char* field, float got, float want) {
  EXPECT_FLOAT_EQ(got, want) << "ModelConfig::" << field;
}

inline void expect_config(const model::ModelConfig& c, const ConfigWant& w) {
#define PAGODA_CONFIG_CHECK_FIELD(f) \
  if (w.f) expect_field(#f, c.f, *w.f);
  PAGODA_CONFIG_CHECKED_FIELDS(PAGODA_CONFIG_CHECK_FIELD)
#undef PAGODA_CONFIG_CHECK_FIELD
}

#undef PAGODA_CONFIG_CHECKED_FIELDS

}  // namespace pagoda::testutil
