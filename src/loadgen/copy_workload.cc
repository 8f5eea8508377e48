#include "loadgen/copy_workload.h"

#include <array>

#include "base/rng.h"
#include "tok/chat_template.h"
#include "tok/tokenizer.h"

namespace pagoda::loadgen {

namespace {

constexpr std::array<const char*, 24> kWords = {
    "total", "count", "items", "value", "limit", "index", "price", "scale", "width", "height", "offset", "result",
    "buffer", "weight", "score", "level", "delta", "factor", "name", "record", "entry", "window", "step", "queue"};

// Short data blocks over placeholders: $F the block's name, $A $B $R words,
// $K a small and $L a two-digit constant. Data, not logic: SmolLM2-135M
// "improves" small functions when asked to repeat them (rewrites loops as
// comprehensions, drops functions), so its greedy answer copies only part of
// a program, and a keyword call it turns into a function; these two blocks
// it copies verbatim in most prompts (session 9, issue 23; it often skips the
// rename), which is what a copy workload is for.
constexpr std::array<const char*, 2> kTemplates = {
    "$F = [\n"
    "    (\"$A\", $K, \"$B\"),\n"
    "    (\"$B\", $L, \"$R\"),\n"
    "    (\"$R\", $K, \"$A\"),\n"
    "]\n",
    "$F = {\n"
    "    \"$A\": $K,\n"
    "    \"$B\": $L,\n"
    "    \"$R\": \"$A_$B\",\n"
    "    \"enabled\": True,\n"
    "    \"tags\": [\"$A\", \"$B\", \"$R\"],\n"
    "}\n",
};

std::string fill(std::string t, const std::array<std::string, 6>& v) {
  static constexpr std::array<const char*, 6> kKeys = {"$F", "$A", "$B", "$R", "$K", "$L"};
  for (size_t k = 0; k < kKeys.size(); ++k) {
    for (size_t at = t.find(kKeys[k]); at != std::string::npos; at = t.find(kKeys[k], at + v[k].size()))
      t.replace(at, 2, v[k]);
  }
  return t;
}

// The long form: a settings dict of kLongEntries distinct keys with integer
// values, about 110 tokens, a realistic length for "repeat this code with one
// change" (issue 23). SmolLM2-135M copies such a dict verbatim in most prompts
// (16 entries: 6 of 6 in session 10's trial; 22 entries: 4 of 6, it starts to
// re-indent or wrap it in a function), unlike a function or a class of the
// same length, which it rewrites.
constexpr int kLongEntries = 16;

std::string long_program(Rng& rng, const std::string& name) {
  std::array<size_t, kWords.size()> order{};
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  for (size_t i = 0; i + 1 < order.size(); ++i)  // partial Fisher-Yates: the first kLongEntries distinct keys
    std::swap(order[i], order[static_cast<size_t>(rng.uniform_int(static_cast<int64_t>(i), order.size() - 1))]);
  std::string t = name + " = {\n";
  for (int i = 0; i < kLongEntries; ++i)
    t += std::string("    \"") + kWords[order[static_cast<size_t>(i)]] + "\": " + std::to_string(rng.uniform_int(2, 99)) + ",\n";
  return t + "}\n";
}

}  // namespace

std::string copy_workload_program(uint64_t seed, int index, CopyLength length) {
  Rng rng(seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(index) + 1);
  auto word = [&] { return std::string(kWords[static_cast<size_t>(rng.uniform_int(0, kWords.size() - 1))]); };
  if (length == CopyLength::kLong) return long_program(rng, word() + "_" + word());
  std::array<std::string, 6> v;
  v[0] = word() + "_" + word();
  v[1] = word();
  do v[2] = word(); while (v[2] == v[1]);
  do v[3] = word(); while (v[3] == v[1] || v[3] == v[2]);
  v[4] = std::to_string(rng.uniform_int(2, 9));
  v[5] = std::to_string(rng.uniform_int(10, 99));
  return fill(kTemplates[static_cast<size_t>(rng.uniform_int(0, kTemplates.size() - 1))], v);
}

std::string copy_workload_message(uint64_t seed, int index, CopyLength length) {
  const std::string program = copy_workload_program(seed, index, length);
  // The change: rename the block (its name is the program's first word).
  const std::string name = program.substr(0, program.find(' '));
  return "Repeat the following Python code exactly, with one change: rename `" + name + "` to `" + name +
         "_v2`. Reply with the code only.\n\n```python\n" + program + "```\n";
}

Expected<std::vector<BenchRequest>> make_copy_workload(const tok::Tokenizer& tk, int num_prompts, int output_len,
                                                       uint64_t seed, CopyLength length) {
  std::vector<BenchRequest> reqs;
  auto tmpl = tok::ChatTemplate::from_tokenizer(tk);  // models without one get the plain text
  for (int i = 0; i < num_prompts; ++i) {
    const std::string ask = copy_workload_message(seed, i, length);
    BenchRequest r;
    r.max_tokens = output_len;
    r.text = ask;  // the chat endpoint sends the message itself (through the server's template)
    if (tmpl.ok()) {
      const tok::ChatMessage msgs[] = {{"user", ask}};
      PAGODA_ASSIGN_OR_RETURN(tok::RenderedPrompt rendered, tmpl->render_prompt(msgs, tok::ChatRenderOptions{}));
      r.prompt = tok::encode_prompt(tk, rendered);
    } else {
      r.prompt = tk.encode(ask + "\n```python\n", /*add_special=*/true, /*parse_special=*/false);
    }
    reqs.push_back(std::move(r));
  }
  return reqs;
}

}  // namespace pagoda::loadgen
