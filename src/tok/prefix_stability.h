// Does a chat template's rendering of turn N+1 extend its rendering of turn N?
// (issue 36, `pagoda template --check-prefix-stability`). When it does not, a
// server's prefix cache misses from that point on for every later turn: the
// most common cause is a template that drops earlier turns' reasoning blocks.
//
// Turns: with A_1 < A_2 < ... the indices of the assistant messages,
//   prompt(N) = the messages before A_N rendered with the generation prompt
//               (what a server tokenizes for turn N's request),
//   full(N)   = the messages through A_N rendered without it (turn N with its
//               reply: what the cache holds after turn N, when the reply
//               tokenizes as the rendering does);
// and, when messages follow the last assistant one, one more prompt for them.
// Turn N+1 is stable when prompt(N+1) starts with full(N). The report gives,
// per unstable turn, the first differing byte and (with a tokenizer) token.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/status.h"
#include "tok/chat_template.h"

namespace pagoda::tok {

class Tokenizer;

struct PrefixBreak {
  int turn = 0;              // N (1-based): prompt(N+1) stops extending full(N)
  int64_t byte = 0;          // first differing byte of the two texts
  int64_t token = -1;        // first differing token of their encodings (-1: no tokenizer)
  std::string context;       // the common text just before the break (up to `context_bytes`)
  std::string prev;          // full(N) from the break (up to `context_bytes`)
  std::string next;          // prompt(N+1) from the break (likewise)
};

struct PrefixStability {
  int num_turns = 0;                 // prompts rendered
  std::vector<PrefixBreak> breaks;   // one per unstable turn, in turn order
  bool stable() const { return breaks.empty(); }
};

// Renders the conversation's turns (see above) and compares them. `tok`: when
// given, token positions use encode_prompt (the server's encoding). Errors:
// messages not an array of objects with a role, no assistant message, any
// render error (named with the turn).
Expected<PrefixStability> check_prefix_stability(const ChatTemplate& tmpl, const nlohmann::ordered_json& messages,
                                                 const ChatRenderOptions& opts, const Tokenizer* tok,
                                                 size_t context_bytes = 40);

}  // namespace pagoda::tok
