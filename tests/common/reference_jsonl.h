// The stories260K reference outputs (tests/data/stories260K.reference.jsonl,
// greedy continuations from llama.cpp), shared by the model, runtime and engine
// tests. One JSON object per line: prompt, prompt_tokens, generated_tokens, text.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace pagoda::testutil {

inline std::string stories_path() { return std::string(PAGODA_TEST_DATA) + "/stories260K.gguf"; }
inline std::string stories_reference_path() {
  return std::string(PAGODA_TEST_DATA) + "/stories260K.reference.jsonl";
}

struct Reference {
  std::string prompt;
  std::vector<int32_t> prompt_tokens;
  std::vector<int32_t> generated_tokens;
  std::string text;
};

// Every reference of the file; a missing, empty or malformed file is a test
// failure (so a loop over the result cannot pass by running zero times).
inline std::vector<Reference> load_references() {
  std::vector<Reference> out;
  const std::string path = stories_reference_path();
  std::ifstream f(path);
  if (!f) {
    ADD_FAILURE() << path << ": cannot open";
    return out;
  }
  std::string line;
  int line_no = 0;
  while (std::getline(f, line)) {
    ++line_no;
    if (line.empty()) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object() || !j.contains("prompt") || !j.contains("prompt_tokens") ||
        !j.contains("generated_tokens") || !j.contains("text")) {
      ADD_FAILURE() << path << ":" << line_no << ": not a reference object";
      continue;
    }
    out.push_back({j["prompt"].get<std::string>(), j["prompt_tokens"].get<std::vector<int32_t>>(),
                   j["generated_tokens"].get<std::vector<int32_t>>(), j["text"].get<std::string>()});
  }
  if (out.empty()) ADD_FAILURE() << path << ": no reference";
  return out;
}

}  // namespace pagoda::testutil
