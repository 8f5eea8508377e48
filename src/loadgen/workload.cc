#include "loadgen/workload.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "base/rng.h"
#include "tok/tokenizer.h"

namespace pagoda::loadgen {

TokenSpace token_space(const tok::Tokenizer& tk) {
  TokenSpace s;
  s.bos = tk.add_bos() ? tk.bos_id() : -1;
  for (int32_t id = 0; id < tk.vocab_size(); ++id) {
    const tok::TokenType t = tk.token_type(id);
    const bool ordinary = t == tok::TokenType::kNormal || t == tok::TokenType::kByte ||
                          t == tok::TokenType::kUserDefined;
    if (ordinary && !tk.is_control(id) && !tk.is_eog(id) && id != tk.bos_id()) s.ordinary.push_back(id);
  }
  return s;
}

namespace {

int32_t uniform_len(Rng& rng, int len, double ratio) {
  const int64_t lo = std::max<int64_t>(1, static_cast<int64_t>(std::floor(len * (1.0 - ratio))));
  const int64_t hi = std::max<int64_t>(lo, static_cast<int64_t>(std::ceil(len * (1.0 + ratio))));
  return static_cast<int32_t>(rng.uniform_int(lo, hi));
}

// Appends n random ordinary ids.
void append_random(Rng& rng, const TokenSpace& space, int64_t n, std::vector<int32_t>* out) {
  const int64_t m = static_cast<int64_t>(space.ordinary.size());
  for (int64_t i = 0; i < n; ++i) out->push_back(space.ordinary[static_cast<size_t>(rng.uniform_int(0, m - 1))]);
}

}  // namespace

std::vector<BenchRequest> make_random_workload(const TokenSpace& space, int num_prompts, int input_len, int output_len,
                                               double range_ratio, uint64_t seed) {
  Rng rng(seed);
  std::vector<BenchRequest> reqs(static_cast<size_t>(std::max(num_prompts, 0)));
  for (BenchRequest& r : reqs) {
    const int32_t in = uniform_len(rng, input_len, range_ratio);
    r.max_tokens = uniform_len(rng, output_len, range_ratio);
    if (space.bos >= 0) r.prompt.push_back(space.bos);
    append_random(rng, space, in - static_cast<int64_t>(r.prompt.size()), &r.prompt);
  }
  return reqs;
}

std::vector<BenchRequest> make_shared_prefix_workload(const TokenSpace& space, int num_groups, int prompts_per_group,
                                                      int prefix_len, int suffix_len, int output_len, uint64_t seed) {
  Rng rng(seed);
  std::vector<BenchRequest> reqs;
  for (int g = 0; g < num_groups; ++g) {
    std::vector<int32_t> prefix;
    if (space.bos >= 0 && prefix_len > 0) prefix.push_back(space.bos);
    append_random(rng, space, prefix_len - static_cast<int64_t>(prefix.size()), &prefix);
    for (int i = 0; i < prompts_per_group; ++i) {
      BenchRequest r;
      r.prompt = prefix;
      if (r.prompt.empty() && space.bos >= 0) r.prompt.push_back(space.bos);
      append_random(rng, space, prefix_len + suffix_len - static_cast<int64_t>(r.prompt.size()), &r.prompt);
      r.max_tokens = output_len;
      reqs.push_back(std::move(r));
    }
  }
  // Fisher-Yates with the same seed stream: deterministic order, groups interleaved.
  for (size_t i = reqs.size(); i > 1; --i) {
    const size_t j = static_cast<size_t>(rng.uniform_int(0, static_cast<int64_t>(i) - 1));
    std::swap(reqs[i - 1], reqs[j]);
  }
  return reqs;
}

Expected<std::vector<BenchRequest>> load_dataset(const std::string& path, const tok::Tokenizer& tk,
                                                 int default_max_tokens, int num_prompts) {
  std::ifstream in(path);
  if (!in) return errorf("dataset %s: cannot open: %s", path.c_str(), std::strerror(errno));
  std::vector<BenchRequest> reqs;
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (num_prompts > 0 && static_cast<int>(reqs.size()) >= num_prompts) break;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object())
      return errorf("dataset %s line %d: not a JSON object", path.c_str(), line_no);
    auto p = j.find("prompt");
    if (p == j.end() || !p->is_string())
      return errorf("dataset %s line %d: needs a string \"prompt\"", path.c_str(), line_no);
    BenchRequest r;
    r.prompt = tk.encode(p->get<std::string>(), /*add_special=*/true, /*parse_special=*/true);
    r.max_tokens = default_max_tokens;
    if (auto m = j.find("max_tokens"); m != j.end() && !m->is_null()) {
      if (!m->is_number_integer() || m->get<int64_t>() < 1 || m->get<int64_t>() > INT32_MAX)
        return errorf("dataset %s line %d: \"max_tokens\" must be a positive integer", path.c_str(), line_no);
      r.max_tokens = static_cast<int32_t>(m->get<int64_t>());
    }
    if (r.prompt.empty()) return errorf("dataset %s line %d: the prompt encodes to no tokens", path.c_str(), line_no);
    reqs.push_back(std::move(r));
  }
  if (reqs.empty()) return errorf("dataset %s: no prompts", path.c_str());
  return reqs;
}

Expected<std::vector<BenchRequest>> load_sharegpt(const std::string& path, const tok::Tokenizer& tk, int num_prompts,
                                                  int output_len, uint64_t seed, bool shuffle) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return errorf("--dataset-path %s: cannot open: %s", path.c_str(), std::strerror(errno));
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_array())
    return errorf("--dataset-path %s: a ShareGPT file is a JSON list of {\"conversations\": [...]}", path.c_str());
  // The (prompt, completion) pairs: the first two turns of each conversation.
  std::vector<std::pair<std::string, std::string>> pairs;
  for (size_t i = 0; i < j.size(); ++i) {
    const nlohmann::json& e = j[i];
    auto c = e.is_object() ? e.find("conversations") : e.end();
    if (!e.is_object() || c == e.end() || !c->is_array())
      return errorf("--dataset-path %s: entry %zu has no \"conversations\" list", path.c_str(), i);
    if (c->size() < 2) continue;
    std::string turn[2];
    for (int k = 0; k < 2; ++k) {
      const nlohmann::json& t = (*c)[k];
      auto v = t.is_object() ? t.find("value") : t.end();
      if (!t.is_object() || v == t.end() || !v->is_string())
        return errorf("--dataset-path %s: entry %zu turn %d has no string \"value\"", path.c_str(), i, k);
      turn[k] = v->get<std::string>();
    }
    pairs.emplace_back(std::move(turn[0]), std::move(turn[1]));
  }
  Rng rng(seed);
  if (shuffle) {
    for (size_t i = pairs.size(); i > 1; --i)
      std::swap(pairs[i - 1], pairs[static_cast<size_t>(rng.uniform_int(0, static_cast<int64_t>(i) - 1))]);
  }
  // vLLM's is_valid_sequence bounds.
  constexpr size_t kMinLen = 4, kMaxPrompt = 1024, kMaxTotal = 2048;
  std::vector<BenchRequest> reqs;
  for (const auto& [prompt, completion] : pairs) {
    if (num_prompts > 0 && static_cast<int>(reqs.size()) >= num_prompts) break;
    BenchRequest r;
    r.text = prompt;
    r.prompt = tk.encode(prompt, /*add_special=*/true, /*parse_special=*/false);
    const size_t out = output_len > 0 ? static_cast<size_t>(output_len)
                                      : tk.encode(completion, /*add_special=*/false, /*parse_special=*/false).size();
    if (r.prompt.size() < kMinLen || (output_len <= 0 && out < kMinLen) || r.prompt.size() > kMaxPrompt ||
        r.prompt.size() + out > kMaxTotal)
      continue;
    r.max_tokens = static_cast<int32_t>(out);
    reqs.push_back(std::move(r));
  }
  if (reqs.empty()) return errorf("--dataset-path %s: no usable conversations", path.c_str());
  // vLLM oversamples a short dataset to the requested count.
  for (size_t have = reqs.size(); num_prompts > 0 && static_cast<int>(reqs.size()) < num_prompts;)
    reqs.push_back(reqs[static_cast<size_t>(rng.uniform_int(0, static_cast<int64_t>(have) - 1))]);
  return reqs;
}

std::vector<double> arrival_times(int n, double rate, uint64_t seed) {
  std::vector<double> t(static_cast<size_t>(std::max(n, 0)), 0.0);
  if (!std::isfinite(rate) || rate <= 0) return t;
  Rng rng(seed ^ 0xA5A5F00DCAFEull);  // its own stream: the rate never changes the prompts
  for (size_t i = 1; i < t.size(); ++i) t[i] = t[i - 1] + rng.exponential(rate);
  return t;
}
}  // namespace pagoda::loadgen
