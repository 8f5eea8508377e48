// Prints random constrained generations as JSON lines {"schema": ..., "doc": "..."}
// for validate_walks.py, which checks each finished document with Python's
// jsonschema (an independent validator). Tokens: the stories260K vocabulary
// (SentencePiece with byte-fallback tokens, so odd UTF-8 paths are exercised).
//   grammar_walks <walks per schema>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "grammar/grammar.h"
#include "grammar/matcher.h"
#include "grammar/token_index.h"
#include "tok/tok_test_util.h"

using namespace pagoda;

static const char* kSchemas[] = {
    R"({"type":"object","properties":{"name":{"type":"string","maxLength":6},
       "age":{"type":"integer","minimum":0,"maximum":120},
       "tags":{"type":"array","items":{"enum":["a","b","c d"]},"maxItems":3},"ok":{"type":"boolean"},
       "kind":{"anyOf":[{"const":"x"},{"type":"null"}]}},"required":["name","age"]})",
    R"({"type":"array","items":{"type":"number","minimum":-10,"exclusiveMaximum":10},"maxItems":4})",
    R"({"type":"object","properties":{"d":{"type":"string","format":"date"},"u":{"type":"string","format":"uuid"},
       "p":{"type":"string","pattern":"^[A-Z]{2}-\\d{3}$"},"t":{"type":"string","format":"time"}},
       "required":["d","p"]})",
    R"({"$defs":{"n":{"type":"object","properties":{"v":{"type":"integer","minimum":-3,"maximum":3},
       "k":{"type":"array","items":{"$ref":"#/$defs/n"},"maxItems":1}},"required":["v"]}},"$ref":"#/$defs/n"})",
    R"({"oneOf":[{"type":"integer","exclusiveMinimum":5,"maximum":1000},{"enum":["x",true,[1,2]]},
       {"type":"string","minLength":2,"maxLength":4}]})",
    R"({"type":"object","properties":{"a":{"type":"boolean"}},"additionalProperties":{"type":"integer","minimum":0,"maximum":9},
       "required":["a"]})",
};

int main(int argc, char** argv) {
  const int walks = argc > 1 ? std::atoi(argv[1]) : 30;
  std::string why;
  const tok::Tokenizer* tk = tok::testing::stories(&why);
  if (tk == nullptr) {
    std::fprintf(stderr, "grammar_walks: %s\n", why.c_str());
    return 1;
  }
  auto ti = grammar::TokenIndex::from_tokenizer(*tk);
  if (!ti.ok()) {
    std::fprintf(stderr, "grammar_walks: %s\n", ti.message().c_str());
    return 1;
  }
  for (const char* schema : kSchemas) {
    auto g = grammar::Grammar::from_json_schema(schema);
    if (!g.ok()) {
      std::fprintf(stderr, "grammar_walks: %s\n", g.message().c_str());
      return 1;
    }
    auto cg = std::make_shared<const grammar::CompiledGrammar>(*g, *ti);
    for (int w = 0; w < walks; ++w) {
      std::mt19937 rng(static_cast<uint32_t>(w * 7919 + 1));
      grammar::Matcher m(cg);
      std::vector<uint32_t> mask(m.mask_words());
      std::string text;
      bool finished = false;
      for (int step = 0; step < 3000 && !finished; ++step) {
        m.fill_mask(mask);
        std::vector<int32_t> ok;
        for (int32_t t = 0; t < (*ti)->vocab_size(); ++t)
          if (((mask[static_cast<size_t>(t) >> 5] >> (t & 31)) & 1) && !(*ti)->is_eog(t)) ok.push_back(t);
        int32_t t;
        if (m.can_end() && (ok.empty() || rng() % 2 == 0)) t = (*ti)->eog_ids().front();
        else if (!ok.empty()) t = ok[rng() % ok.size()];
        else break;  // dead end: reported as unfinished, the script fails on it
        if (!m.accept(t)) {
          std::fprintf(stderr, "grammar_walks: masked token %d rejected\n", t);
          return 1;
        }
        if ((*ti)->is_eog(t)) finished = true;
        else text += (*ti)->token_bytes(t);
      }
      nlohmann::json line;
      line["schema"] = nlohmann::json::parse(schema);
      line["finished"] = finished;
      line["doc"] = text;  // valid UTF-8 by construction (the grammar admits no other)
      std::printf("%s\n", line.dump().c_str());
    }
  }
  return 0;
}
