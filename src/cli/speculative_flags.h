// --speculative-config (vLLM's JSON, method "ngram") and its short alias
// --speculative-ngram K, shared by serve, run and the bench workloads.
#pragma once
#include <string>

#include "cli/engine_flags.h"
#include "engine/speculative.h"

namespace pagoda::cli {

// Parses '{"method":"ngram","num_speculative_tokens":K,"prompt_lookup_max":N,
// "prompt_lookup_min":M}' into c. vLLM's defaults: both bounds 5 when neither
// is given, else the missing one equals the given one. Other methods, unknown
// keys and bad values are errors. Returns "" or the message.
std::string parse_speculative_config_json(const std::string& json, engine::SpeculativeConfig* c);
// --speculative-ngram K: K draft tokens by prompt lookup with vLLM's default n-gram bounds.
std::string parse_speculative_ngram(const std::string& value, engine::SpeculativeConfig* c);
// Reads both flags from args (the later one given wins over nothing: both at once is an error).
std::string parse_speculative_flags(Args& args, engine::SpeculativeConfig* c);

// The flags' help lines, a literal so each command's usage text can splice it in.
#define PAGODA_SPECULATIVE_FLAGS_HELP                                                                      \
  "  --speculative-config JSON     speculative decoding (vLLM's flag; method ngram = prompt lookup):\n"   \
  "                                '{\"method\":\"ngram\",\"num_speculative_tokens\":K,\n"                  \
  "                                \"prompt_lookup_max\":N,\"prompt_lookup_min\":M}' (N, M default 5);\n" \
  "                                greedy output is unchanged; pagoda's \"adaptive_length\":false drafts\n"  \
  "                                every proposed token (default: only as many as measured steps pay for)\n" \
  "  --speculative-ngram K         the same with K draft tokens and the default n-gram bounds\n"

}  // namespace pagoda::cli
