// pagoda bench --workload copy: prompts whose answers copy them. Each asks
// the model (through its chat template, when it has one) to repeat a short
// generated block of Python data with one small change (rename it), so
// most of the output is a verbatim run of the prompt: the workload where
// prompt-lookup speculative decoding (--speculative-config, method ngram)
// pays off. Requests end at the model's end of generation (or max_tokens).
// --workload copy-long: the same request over a 16-entry dict (answers of
// about 110 tokens instead of about 50).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "loadgen/workload.h"

namespace pagoda::tok { class Tokenizer; }

namespace pagoda::loadgen {

enum class CopyLength {
  kShort,  // --workload copy: a 5-7 line block (a list of 3 tuples or a 5-key dict)
  kLong,   // --workload copy-long: an 18-line dict of 16 integer settings
};

// The program of request i (deterministic in seed, i and length): one block
// of Python data, identifiers drawn from a word list.
std::string copy_workload_program(uint64_t seed, int index, CopyLength length = CopyLength::kShort);
// The user message of request i: "Repeat the following Python code exactly,
// with one change: rename `X` to `X_v2`. ..." and the program in a fence.
std::string copy_workload_message(uint64_t seed, int index, CopyLength length = CopyLength::kShort);
// N requests with max_tokens = output_len. Same arguments -> same requests.
Expected<std::vector<BenchRequest>> make_copy_workload(const tok::Tokenizer& tk, int num_prompts, int output_len,
                                                       uint64_t seed, CopyLength length = CopyLength::kShort);

}  // namespace pagoda::loadgen
