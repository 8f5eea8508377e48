#include "tok/prefix_stability.h"

#include <algorithm>

#include "tok/tokenizer.h"

namespace pagoda::tok {

namespace {

// Cuts s to at most n bytes without splitting a UTF-8 character: from its
// start (head) or ending at its end (tail).
std::string utf8_head(std::string_view s, size_t n) {
  if (s.size() <= n) return std::string(s);
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return std::string(s.substr(0, n));
}
std::string utf8_tail(std::string_view s, size_t n) {
  if (s.size() <= n) return std::string(s);
  size_t from = s.size() - n;
  while (from < s.size() && (static_cast<unsigned char>(s[from]) & 0xC0) == 0x80) ++from;
  return std::string(s.substr(from));
}

}  // namespace

Expected<PrefixStability> check_prefix_stability(const ChatTemplate& tmpl, const nlohmann::ordered_json& messages,
                                                 const ChatRenderOptions& opts, const Tokenizer* tok,
                                                 size_t context_bytes) {
  if (!messages.is_array()) return errorf("messages: expected a JSON array of {role, content} objects");
  std::vector<size_t> assistants;
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& m = messages[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      return errorf("messages[%zu]: expected an object with a string \"role\"", i);
    if (m["role"] == "assistant") assistants.push_back(i);
  }
  if (assistants.empty()) return errorf("messages: no assistant message, so no turn to compare");
  auto render = [&](size_t n, bool gen, const char* what, size_t turn) -> Expected<RenderedPrompt> {
    ChatRenderOptions o = opts;
    o.add_generation_prompt = gen;
    const nlohmann::ordered_json part(messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(n));
    auto r = tmpl.render_json(part, o);
    if (!r.ok()) return errorf("turn %zu (%s): %s", turn, what, r.message().c_str());
    return r;
  };
  // The prompts' ends: each assistant message, then the end when more follows.
  std::vector<size_t> prompt_ends = assistants;
  if (assistants.back() + 1 < messages.size()) prompt_ends.push_back(messages.size());
  PrefixStability out;
  out.num_turns = static_cast<int>(prompt_ends.size());
  for (size_t n = 0; n + 1 < prompt_ends.size(); ++n) {
    PAGODA_ASSIGN_OR_RETURN(RenderedPrompt full, render(assistants[n] + 1, false, "with its reply", n + 1));
    PAGODA_ASSIGN_OR_RETURN(RenderedPrompt next, render(prompt_ends[n + 1], true, "prompt", n + 2));
    const std::string& a = full.text;
    const std::string& b = next.text;
    const size_t common = std::min(a.size(), b.size());
    const auto byte = static_cast<size_t>(
        std::mismatch(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(common), b.begin()).first - a.begin());
    if (byte == a.size()) continue;  // the next prompt extends this turn's rendering
    PrefixBreak br;
    br.turn = static_cast<int>(n + 1);
    br.byte = static_cast<int64_t>(byte);
    br.context = utf8_tail(std::string_view(a).substr(0, byte), context_bytes);
    br.prev = utf8_head(std::string_view(a).substr(byte), context_bytes);
    br.next = utf8_head(std::string_view(b).substr(byte), context_bytes);
    if (tok != nullptr) {
      const std::vector<TokenId> ta = encode_prompt(*tok, full);
      const std::vector<TokenId> tb = encode_prompt(*tok, next);
      const size_t tc = std::min(ta.size(), tb.size());
      br.token = std::mismatch(ta.begin(), ta.begin() + static_cast<std::ptrdiff_t>(tc), tb.begin()).first - ta.begin();
    }
    out.breaks.push_back(std::move(br));
  }
  return out;
}

}  // namespace pagoda::tok
