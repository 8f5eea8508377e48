// The server's view of the tokenizer: prompt encoding, chat rendering and token
// text for logprobs. Thin adapter over tok/ so routes stay tokenizer-agnostic.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "server/openai_api.h"

namespace pagoda::tok { class Tokenizer; }

namespace pagoda::server {

// Completion prompt text -> ids (BOS added when the model's tokenizer adds it).
std::vector<int32_t> encode_prompt(const tok::Tokenizer& t, const std::string& text, bool add_special = true);
// Chat messages -> ids through the model's chat template with the generation prompt.
Expected<std::vector<int32_t>> encode_chat(const tok::Tokenizer& t, const std::vector<ChatMessage>& messages);
// The raw text of one token (may be a partial UTF-8 sequence).
std::string token_piece(const tok::Tokenizer& t, int32_t id);
std::string decode_tokens(const tok::Tokenizer& t, const std::vector<int32_t>& ids);

}  // namespace pagoda::server
