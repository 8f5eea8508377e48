#include "tok/tok_test_util.h"

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "gguf/gguf.h"

namespace pagoda::tok::testing {

namespace {

struct Loaded {
  std::unique_ptr<gguf::GgufFile> file;
  std::unique_ptr<Tokenizer> tok;
  std::string error;
};

Loaded load(const std::string& path) {
  Loaded l;
  if (!std::filesystem::exists(path)) {
    l.error = "model file not found: " + path;
    return l;
  }
  auto f = gguf::GgufFile::open(path);
  if (!f.ok()) {
    l.error = f.message();
    return l;
  }
  l.file = std::move(f).value();
  auto t = Tokenizer::from_gguf(*l.file);
  if (!t.ok()) {
    l.error = t.message();
    return l;
  }
  l.tok = std::move(t).value();
  return l;
}

const Tokenizer* get(const Loaded& l, std::string* why) {
  if (!l.tok && why) *why = l.error;
  return l.tok.get();
}

}  // namespace

std::string stories_path() { return PAGODA_TEST_DATA "/stories260K.gguf"; }
std::string smollm2_path() { return PAGODA_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf"; }

const Tokenizer* stories(std::string* why) {
  static const Loaded l = load(stories_path());
  return get(l, why);
}

const Tokenizer* smollm2(std::string* why) {
  static const Loaded l = load(smollm2_path());
  return get(l, why);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace pagoda::tok::testing
