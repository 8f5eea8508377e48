// Mask time per token (p50/p99) for a few constraints over the SmolLM2 vocabulary,
// along the tokens of a real JSON document. "cold" is the first pass over a fresh
// CompiledGrammar (contexts computed on first use), "warm" a second sequence over
// the same CompiledGrammar (what the 31 other streams of a batch, and every later
// request with the same schema, see).
//   bench_grammar [model.gguf]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "grammar/grammar.h"
#include "grammar/matcher.h"
#include "grammar/token_index.h"
#include "tok/tokenizer.h"

using namespace pagoda;
using Clock = std::chrono::steady_clock;

namespace {

double us(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

struct Case {
  const char* name;
  const char* schema;  // nullptr: json_object mode
  const char* doc;
};

const Case kCases[] = {
    {"person", R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer","minimum":0,"maximum":150},
      "email":{"type":"string","format":"email"},"tags":{"type":"array","items":{"type":"string"},"maxItems":8},
      "address":{"type":"object","properties":{"street":{"type":"string"},"city":{"type":"string"},
      "zip":{"type":"string","pattern":"^[0-9]{5}$"}},"required":["street","city"]}},"required":["name","age"]})",
     R"({"name": "Ada Lovelace", "age": 36, "email": "ada@example.org", "tags": ["math", "poetry", "engines"], "address": {"street": "12 St James's Square", "city": "London", "zip": "12345"}})"},
    {"tool_call", R"({"type":"object","properties":{"name":{"enum":["get_weather","search","send_email"]},
      "arguments":{"type":"object","properties":{"location":{"type":"string"},"unit":{"enum":["celsius","fahrenheit"]},
      "days":{"type":"integer","minimum":1,"maximum":14}},"required":["location"]}},"required":["name","arguments"]})",
     R"({"name": "get_weather", "arguments": {"location": "San Francisco, CA", "unit": "celsius", "days": 5}})"},
    {"json_object", nullptr,
     R"({"id": 1842, "title": "Quarterly report", "done": false, "scores": [0.5, 1.25, -3e2], "owner": {"first": "Grace", "last": "Hopper"}, "notes": null})"},
};

void pct(std::vector<double> v, const char* label, size_t contexts) {
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  std::printf("  %-5s tokens=%zu  mean=%.1f us  p50=%.1f us  p99=%.1f us  max=%.1f us  contexts=%zu\n", label,
              v.size(), sum / static_cast<double>(v.size()), v[v.size() / 2],
              v[std::min(v.size() - 1, v.size() * 99 / 100)], v.back(), contexts);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string path = argc > 1 ? argv[1] : PAGODA_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  auto file = gguf::GgufFile::open(path);
  if (!file.ok()) {
    std::fprintf(stderr, "bench_grammar: %s\n", file.message().c_str());
    return 1;
  }
  auto tk = tok::Tokenizer::from_gguf(**file);
  if (!tk.ok()) {
    std::fprintf(stderr, "bench_grammar: %s\n", tk.message().c_str());
    return 1;
  }
  auto t0 = Clock::now();
  auto ti = grammar::TokenIndex::from_tokenizer(**tk);
  auto t1 = Clock::now();
  if (!ti.ok()) {
    std::fprintf(stderr, "bench_grammar: %s\n", ti.message().c_str());
    return 1;
  }
  std::printf("vocab %d tokens, trie %zu nodes, built in %.1f ms\n", (*ti)->vocab_size(), (*ti)->nodes().size(),
              us(t0, t1) / 1000);
  for (const Case& c : kCases) {
    t0 = Clock::now();
    auto g = c.schema ? grammar::Grammar::from_json_schema(c.schema) : grammar::Grammar::json_object();
    t1 = Clock::now();
    if (!g.ok()) {
      std::fprintf(stderr, "%s: %s\n", c.name, g.message().c_str());
      return 1;
    }
    std::printf("%s: grammar %zu rules, %zu elements, compiled in %.2f ms\n", c.name, (*g)->num_rules(),
                (*g)->elements().size(), us(t0, t1) / 1000);
    auto cg = std::make_shared<const grammar::CompiledGrammar>(*g, *ti);
    const std::vector<tok::TokenId> ids = (*tk)->encode(c.doc, false, false);
    for (const char* label : {"cold", "warm"}) {
      grammar::Matcher m(cg);
      std::vector<uint32_t> mask(m.mask_words());
      std::vector<double> times;
      for (tok::TokenId id : ids) {
        const auto a = Clock::now();
        m.fill_mask(mask);
        const auto b = Clock::now();
        times.push_back(us(a, b));
        if (!((mask[static_cast<size_t>(id) >> 5] >> (id & 31)) & 1) || !m.accept(id)) {
          std::fprintf(stderr, "%s: document token %d (%s) not allowed\n", c.name, id,
                       (*tk)->token_to_piece(id).c_str());
          return 1;
        }
      }
      const auto a = Clock::now();
      m.fill_mask(mask);
      times.push_back(us(a, Clock::now()));
      if (!m.can_end()) {
        std::fprintf(stderr, "%s: document incomplete for the grammar\n", c.name);
        return 1;
      }
      pct(times, label, cg->stats().contexts);
    }
  }
  return 0;
}
