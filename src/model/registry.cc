// The architecture registry: `general.architecture` -> the ArchDef its file defines.
#include <iterator>

#include "model/arch.h"

namespace pagoda::model {

// Defined in llama.cc, qwen2.cc, qwen3.cc, phi3.cc, gemma3.cc, lfm2.cc, qwen35.cc, mamba2.cc.
extern const ArchDef kLlamaArch, kQwen2Arch, kQwen3Arch, kPhi3Arch, kGemma3Arch, kLfm2Arch, kQwen35Arch, kMamba2Arch;

namespace {

struct Entry {
  const char* name;
  const ArchDef* def;
};

// One line per architecture name.
constexpr Entry kArchs[] = {
    {"llama", &kLlamaArch},
    {"mistral", &kLlamaArch},  // same tensors, keys and forward as llama under its own key prefix
    {"qwen2", &kQwen2Arch},
    {"qwen3", &kQwen3Arch},
    {"phi3", &kPhi3Arch},
    {"gemma3", &kGemma3Arch},
    {"lfm2", &kLfm2Arch},
    {"qwen35", &kQwen35Arch},  // Qwen3.5: gated delta-net + gated attention
    {"mamba2", &kMamba2Arch},  // Mamba-2: selective-scan layers only, no attention
};

}  // namespace

const ArchDef* find_arch(std::string_view name) {
  for (const Entry& e : kArchs) {
    if (name == e.name) return e.def;
  }
  return nullptr;
}

std::string arch_names() {
  std::string s;
  for (const Entry& e : kArchs) s += (s.empty() ? "" : ", ") + std::string(e.name);
  return s;
}

}  // namespace pagoda::model
