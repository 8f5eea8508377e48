#include "cli/bench_copy_workload.h"

#include <array>

#include "base/rng.h"
#include "tok/chat_template.h"
#include "tok/tokenizer.h"

namespace pagoda::cli::bench {

namespace {

constexpr std::array<const char*, 24> kWords = {
    "total", "count", "items", "value", "limit", "index", "price", "scale", "width", "height", "offset", "result",
    "buffer", "weight", "score", "level", "delta", "factor", "name", "record", "entry", "window", "step", "queue"};

// Functions over placeholders: $F function name, $A $B parameters, $R a local, $K a constant.
constexpr std::array<const char*, 5> kTemplates = {
    "def $F($A, $B):\n"
    "    \"\"\"Return every $A-th multiple of $B.\"\"\"\n"
    "    $R = []\n"
    "    for i in range($A):\n"
    "        if i % $K == 0:\n"
    "            $R.append(i * $B)\n"
    "        else:\n"
    "            $R.append(i + $B)\n"
    "    return $R\n",
    "def $F($A, $B=$K):\n"
    "    $R = 0\n"
    "    for x in $A:\n"
    "        if x > $B:\n"
    "            $R += x - $B\n"
    "    return $R\n",
    "class $F:\n"
    "    def __init__(self, $A, $B):\n"
    "        self.$A = $A\n"
    "        self.$B = $B\n"
    "        self.$R = $K\n"
    "\n"
    "    def update(self, delta):\n"
    "        self.$R += delta * self.$B\n"
    "        return self.$R\n",
    "def $F($A):\n"
    "    $R = {}\n"
    "    for key, $B in $A.items():\n"
    "        $R.setdefault($B % $K, []).append(key)\n"
    "    return sorted($R.items())\n",
    "def $F($A, $B):\n"
    "    while $A > $K:\n"
    "        $A, $B = $B, $A % $B\n"
    "    $R = $A + $B\n"
    "    print(\"$F:\", $R)\n"
    "    return $R\n",
};

std::string fill(std::string t, const std::array<std::string, 5>& v) {
  static constexpr std::array<const char*, 5> kKeys = {"$F", "$A", "$B", "$R", "$K"};
  for (size_t k = 0; k < kKeys.size(); ++k) {
    for (size_t at = t.find(kKeys[k]); at != std::string::npos; at = t.find(kKeys[k], at + v[k].size()))
      t.replace(at, 2, v[k]);
  }
  return t;
}

}  // namespace

std::string copy_workload_program(uint64_t seed, int index) {
  Rng rng(seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(index) + 1);
  auto word = [&] { return std::string(kWords[static_cast<size_t>(rng.uniform_int(0, kWords.size() - 1))]); };
  std::string out;
  const int n = static_cast<int>(rng.uniform_int(2, 3));
  for (int f = 0; f < n; ++f) {
    std::array<std::string, 5> v;
    v[0] = word() + "_" + word();
    v[1] = word();
    do v[2] = word(); while (v[2] == v[1]);
    do v[3] = word(); while (v[3] == v[1] || v[3] == v[2]);
    v[4] = std::to_string(rng.uniform_int(2, 9));
    if (f > 0) out += "\n\n";
    out += fill(kTemplates[static_cast<size_t>(rng.uniform_int(0, kTemplates.size() - 1))], v);
  }
  return out;
}

Expected<std::vector<BenchRequest>> make_copy_workload(const tok::Tokenizer& tk, int num_prompts, int output_len,
                                                       uint64_t seed) {
  std::vector<BenchRequest> reqs;
  auto tmpl = tok::ChatTemplate::from_tokenizer(tk);  // models without one get the plain text
  for (int i = 0; i < num_prompts; ++i) {
    const std::string program = copy_workload_program(seed, i);
    // The change: rename the first function (the name up to its '(' or ':').
    const size_t name_at = program.find(' ') + 1;
    const std::string name = program.substr(name_at, program.find_first_of("(:", name_at) - name_at);
    const std::string ask = "Repeat the following Python code exactly, with one change: rename `" + name + "` to `" +
                            name + "_v2`. Reply with the code only.\n\n```python\n" + program + "```\n";
    BenchRequest r;
    r.max_tokens = output_len;
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

}  // namespace pagoda::cli::bench
