// pagoda synth --preset NAME --type TYPE [--layers N] [--seed S] -o FILE.gguf
// Writes a random-weight model of a real shape (llama.cpp-compatible GGUF).
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "base/timer.h"
#include "cli/command.h"
#include "cli/engine_flags.h"
#include "gguf/gguf.h"
#include "gguf/synth.h"

namespace pagoda::cli {
namespace {

void synth_usage(FILE* out) {
  std::fprintf(out,
               "usage: pagoda synth --preset NAME --type TYPE [--layers N] [--seed S] [--metadata-only] -o FILE.gguf\n"
               "  --preset  ");
  for (const auto& p : gguf::synth_presets()) std::fprintf(out, "%s ", p.name.c_str());
  std::fprintf(out,
               "\n  --type    f32 | f16 | bf16 | q8_0 | q4_0 | q4_1 | q5_0 | q5_1 | q2_k | q3_k | q4_k | q4_k_m | q6_k |\n"
               "            iq4_nl | iq4_xs   (norms and biases stay f32; k-quant files keep rows that are not a multiple\n"
               "            of 256 as q4_0 (q2_k, q3_k) / q4_1 (q4_k) / q8_0 (q6_k) / iq4_nl (iq4_xs); q4_k_m is\n"
               "            llama.cpp's mix: q4_k with q6_k attn_v and ffn_down in half the layers)\n"
               "  --layers  keep only the first N layers (default: the preset's)\n"
               "  --seed    weight RNG seed (default 0); weights are N(0, 0.02), norm weights 1.0\n"
               "  --metadata-only  the header and metadata alone, no tensors: a shape for `pagoda size`,\n"
               "            `sim` and `inspect` (which read no weights), not a model the engine can load\n");
}

bool parse_type(const std::string& s, GgmlType* t) {
  static const std::pair<const char*, GgmlType> kTypes[] = {{"f32", GgmlType::F32},   {"f16", GgmlType::F16},
                                                            {"bf16", GgmlType::BF16}, {"q8_0", GgmlType::Q8_0},
                                                            {"q4_0", GgmlType::Q4_0}, {"q4_1", GgmlType::Q4_1},
                                                            {"q5_0", GgmlType::Q5_0}, {"q5_1", GgmlType::Q5_1},
                                                            {"q4_k", GgmlType::Q4_K}, {"q6_k", GgmlType::Q6_K},
                                                            {"q2_k", GgmlType::Q2_K}, {"q3_k", GgmlType::Q3_K},
                                                            {"iq4_nl", GgmlType::IQ4_NL}, {"iq4_xs", GgmlType::IQ4_XS}};
  for (const auto& [name, type] : kTypes)
    if (s == name) {
      *t = type;
      return true;
    }
  return false;
}

bool parse_u64(const char* s, uint64_t* out) {
  if (!s || !*s) return false;
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(s, &end, 10);
  if (errno || *end || s[0] == '-') return false;
  *out = v;
  return true;
}

int run_synth(int argc, char** argv) {
  std::string preset, type_name = "q8_0", out;
  uint64_t layers = 0, seed = 0;
  Args args(argc, argv);  // the one parser of every subcommand (cli/engine_flags.h)
  if (args.help()) {
    synth_usage(stdout);
    return 0;
  }
  std::string v;
  args.value("--preset", &preset);
  args.value("--type", &type_name);
  args.value("--output", &out, "-o");
  const bool metadata_only = args.flag("--metadata-only");
  if (args.value("--layers", &v) && (!parse_u64(v.c_str(), &layers) || layers == 0 || layers > 4096)) {
    std::fprintf(stderr, "pagoda synth: --layers needs a positive integer\n");
    return 2;
  }
  if (args.value("--seed", &v) && !parse_u64(v.c_str(), &seed)) {
    std::fprintf(stderr, "pagoda synth: --seed needs a non-negative integer\n");
    return 2;
  }
  if (std::string err = args.leftover(); !err.empty()) {
    std::fprintf(stderr, "pagoda synth: %s\n\n", err.c_str());
    synth_usage(stderr);
    return 2;
  }
  if (preset.empty() || out.empty()) {
    std::fprintf(stderr, "pagoda synth: --preset and -o are required\n\n");
    synth_usage(stderr);
    return 2;
  }
  const gguf::SynthShape* shape = gguf::find_synth_preset(preset);
  if (!shape) {
    std::fprintf(stderr, "pagoda synth: unknown preset '%s'\n\n", preset.c_str());
    synth_usage(stderr);
    return 2;
  }
  gguf::SynthOptions opt;
  opt.shape = *shape;
  opt.q4_k_m = type_name == "q4_k_m";
  if (!parse_type(opt.q4_k_m ? "q4_k" : type_name, &opt.type)) {
    std::fprintf(stderr, "pagoda synth: unknown --type '%s'\n\n", type_name.c_str());
    synth_usage(stderr);
    return 2;
  }
  opt.n_layers_override = static_cast<int64_t>(layers);
  opt.k_quant_fallback = true;
  opt.seed = seed;

  Timer timer;
  Status st = Status::Ok();
  if (metadata_only) {
    gguf::GgufWriter full, meta;
    st = gguf::synth_model(opt, &full);
    for (const auto& [key, value] : full.metadata()) meta.set(key, value);
    if (st.ok()) st = meta.write_file(out);
  } else {
    st = gguf::synth_model_file(opt, out);
  }
  if (!st.ok()) {
    std::fprintf(stderr, "pagoda synth: %s\n", st.message().c_str());
    return 1;
  }
  auto f = gguf::GgufFile::open(out);
  if (!f.ok()) {
    std::fprintf(stderr, "pagoda synth: wrote %s but cannot read it back: %s\n", out.c_str(), f.message().c_str());
    return 1;
  }
  uint64_t params = 0;
  for (const auto& t : (*f)->tensors()) params += t.n_elements;
  std::printf("wrote %s: %s %s, %" PRId64 " layers, %zu tensors, %.1fM parameters, %.1f MiB in %.1f s\n", out.c_str(),
              preset.c_str(), type_name.c_str(),
              opt.n_layers_override > 0 ? opt.n_layers_override : shape->n_layer, (*f)->tensors().size(),
              params / 1e6, (*f)->file_size() / 1048576.0, timer.seconds());
  return 0;
}

Register reg_synth("synth", "write a random-weight GGUF model of a real shape", run_synth);

}  // namespace
}  // namespace pagoda::cli
