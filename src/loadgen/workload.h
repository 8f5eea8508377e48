// The serving benchmark's workloads (vLLM benchmark_serving's datasets): random
// token-id prompts, shared prefixes, pagoda's JSONL and vLLM's ShareGPT files, and
// Poisson arrival times. Plain data: the in-process run (loadgen/serving.h) and the
// HTTP client (loadgen/http_client.h) send the same requests. See docs/serving-bench.md.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace pagoda::tok { class Tokenizer; }

namespace pagoda::loadgen {

// Which ids a random prompt may hold.
struct TokenSpace {
  int32_t bos = -1;                // prepended to every prompt when >= 0 (counts in the length)
  std::vector<int32_t> ordinary;   // normal/byte/user-defined ids: no control, unknown, unused or end-of-generation ids
};
TokenSpace token_space(const tok::Tokenizer& tk);

struct BenchRequest {
  std::vector<int32_t> prompt;     // token ids, BOS included
  int32_t max_tokens = 0;
  std::string text;                // the prompt as text when a dataset gave it (the chat endpoint sends
                                   // it; else the ids, decoded)
};

// N requests; prompt and output lengths uniform in [L*(1-r), L*(1+r)] (at least 1).
// Same arguments -> same requests. Precondition: space.ordinary non-empty.
std::vector<BenchRequest> make_random_workload(const TokenSpace& space, int num_prompts, int input_len, int output_len,
                                               double range_ratio, uint64_t seed);

// G random prefixes of P tokens (BOS included), each followed by R distinct random
// Q-token suffixes; the G*R requests are shuffled with the seed.
std::vector<BenchRequest> make_shared_prefix_workload(const TokenSpace& space, int num_groups, int prompts_per_group,
                                                      int prefix_len, int suffix_len, int output_len, uint64_t seed);

// JSONL of {"prompt": str, "max_tokens": int}; prompts encoded with the model's
// special tokens (BOS). max_tokens absent -> default_max_tokens. Keeps the first
// num_prompts lines (all when <= 0). Blank lines are skipped.
Expected<std::vector<BenchRequest>> load_dataset(const std::string& path, const tok::Tokenizer& tk,
                                                 int default_max_tokens, int num_prompts);

// vLLM's ShareGPT dataset: a JSON list of {"conversations": [{"from": "human", "value": P},
// {"from": "gpt", "value": C}, ...]}. Entries with fewer than two turns are skipped;
// the rest are shuffled with the seed (unless !shuffle); each gives prompt P (encoded
// with BOS) and max_tokens = the token count of C, or output_len when > 0. As vLLM,
// pairs with a prompt or completion under 4 tokens (the completion only when its length
// is not fixed), a prompt over 1024 or a total over 2048 tokens are skipped; when fewer
// than num_prompts remain, seeded picks of them repeat until there are num_prompts.
Expected<std::vector<BenchRequest>> load_sharegpt(const std::string& path, const tok::Tokenizer& tk, int num_prompts,
                                                  int output_len, uint64_t seed, bool shuffle);

// Arrival times in seconds from the start: 0 for the first, then exponential gaps
// of mean 1/rate (Poisson process). rate = inf: every request at 0.
std::vector<double> arrival_times(int n, double rate, uint64_t seed);

}  // namespace pagoda::loadgen
