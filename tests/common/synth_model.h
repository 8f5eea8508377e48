// A synth model from a named preset, written to a per-process temp file and loaded
// once per test suite (SetUpTestSuite), shared by tests that need real-shaped weights.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <utility>

#include "gguf/synth.h"
#include "model/model.h"

namespace pagoda::testing_common {

// Writes preset `preset` with `type` weights, `n_layers` layers and `seed` to
// TempDir()/<stem>_<pid>.gguf (*path) and loads it into *model (owned by the caller).
// Fails the test (fatally) on any error.
inline void load_synth_preset(const std::string& stem, const char* preset, GgmlType type, int n_layers,
                              uint64_t seed, std::string* path, const model::Model** model) {
  *path = ::testing::TempDir() + stem + "_" + std::to_string(::getpid()) + ".gguf";
  const gguf::SynthShape* s = gguf::find_synth_preset(preset);
  ASSERT_NE(s, nullptr) << "no " << preset << " synth preset";
  gguf::SynthOptions o;
  o.shape = *s;
  o.type = type;
  o.n_layers_override = n_layers;
  o.seed = seed;
  const Status st = gguf::synth_model_file(o, *path);
  ASSERT_TRUE(st.ok()) << st.message();
  auto m = model::Model::load(*path);
  ASSERT_TRUE(m.ok()) << m.message();
  *model = std::move(m).value().release();
}

}  // namespace pagoda::testing_common
