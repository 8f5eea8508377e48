// pagoda bench --workload copy: prompts whose answers copy them. Each asks
// the model (through its chat template, when it has one) to repeat a short
// generated block of Python data with one small change (rename it), so
// most of the output is a verbatim run of the prompt: the workload where
// prompt-lookup speculative decoding (--speculative-config, method ngram)
// pays off. Requests end at the model's end of generation (or max_tokens).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "cli/bench_serving.h"

namespace pagoda::tok { class Tokenizer; }

namespace pagoda::cli::bench {

// The program of request i (deterministic in seed and i): one 5-7 line block
// of Python data (a list of tuples or a dict), identifiers
// drawn from a word list.
std::string copy_workload_program(uint64_t seed, int index);
// The user message of request i: "Repeat the following Python code exactly,
// with one change: rename `X` to `X_v2`. ..." and the program in a fence.
std::string copy_workload_message(uint64_t seed, int index);
// N requests with max_tokens = output_len. Same arguments -> same requests.
Expected<std::vector<BenchRequest>> make_copy_workload(const tok::Tokenizer& tk, int num_prompts, int output_len,
                                                       uint64_t seed);

}  // namespace pagoda::cli::bench
