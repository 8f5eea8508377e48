// Request streams for `pagoda sim`: random prompts, prompts sharing a prefix,
// or a JSONL trace. Tokens are synthetic ids; only their equality matters (it
// decides prefix-cache hits), so the same seed gives the same stream everywhere.
#pragma once
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "base/status.h"

namespace pagoda::sim {

struct SimRequest {
  double arrival_s = 0;
  std::vector<int32_t> prompt;  // [input_len] token ids
  int32_t output_len = 1;       // tokens to generate (>= 1)
};

enum class WorkloadKind : uint8_t { kRandom, kSharedPrefix, kTrace };

struct WorkloadSpec {
  WorkloadKind kind = WorkloadKind::kRandom;
  int32_t num_prompts = 100;
  int32_t input_len = 512;
  int32_t output_len = 128;
  double range_ratio = 0.0;       // lengths uniform in [len x (1 - r), len x (1 + r)]
  int32_t prefix_len = 0;         // shared-prefix: tokens of the shared prefix (0: input_len / 2)
  int32_t num_prefixes = 1;       // shared-prefix: distinct prefixes, assigned round robin
  double request_rate = std::numeric_limits<double>::infinity();  // req/s, Poisson; inf: all at t = 0
  uint64_t seed = 0;
  // Trace (JSONL, one request per line):
  //   {"timestamp": 0.5, "input_len": 900, "output_len": 120, "hash_ids": [1, 2, 3]}
  // timestamp in seconds ("timestamp_ms" in milliseconds; missing: Poisson at request_rate);
  // "input_length"/"output_length" are accepted too (Mooncake traces). hash_ids name blocks of
  // trace_block_tokens tokens: equal ids are equal tokens, so they share a prefix.
  std::string trace_path;
  int32_t trace_block_tokens = 512;
  int32_t vocab = 32000;          // token ids are drawn from [1, vocab)
};

// "random", "shared-prefix", or a path to a .jsonl trace.
Expected<WorkloadKind> parse_workload_kind(const std::string& s);

// Requests sorted by arrival. Errors name the trace line.
Expected<std::vector<SimRequest>> make_workload(const WorkloadSpec& spec);

}  // namespace pagoda::sim
