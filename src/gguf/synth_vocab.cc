// Synthetic GPT-2 style byte-level BPE vocabulary (see synth.h).
#include <unordered_set>

#include "base/rng.h"
#include "gguf/synth.h"

namespace pagoda::gguf {

namespace {

void append_utf8(std::string& s, uint32_t cp) {
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::vector<std::string> llama3_specials() {
  std::vector<std::string> s = {"<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                                "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>",
                                "<|reserved_special_token_2|>", "<|start_header_id|>", "<|end_header_id|>",
                                "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"};
  for (int i = 3; s.size() < 256; ++i) s.push_back("<|reserved_special_token_" + std::to_string(i) + "|>");
  return s;
}

const std::vector<std::string> kQwenSpecials = {
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"};

// Phi-3's added tokens from id 32000 (Phi-3-mini's tokenizer.json).
const std::vector<std::string> kPhi3Specials = {
    "<|endoftext|>", "<|assistant|>", "<|placeholder1|>", "<|placeholder2|>", "<|placeholder3|>", "<|placeholder4|>",
    "<|system|>", "<|end|>", "<|placeholder5|>", "<|placeholder6|>", "<|user|>"};

const char* kChatML =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
const char* kLlama3Template =
    "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}{% if "
    "add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";

// Phi-3.5-mini-instruct's template (the sdist's microsoft-Phi-3.5-mini-instruct.jinja).
const char* kPhi3Template =
    "{% for message in messages %}{% if message['role'] == 'system' and message['content'] %}{{'<|system|>\\n' + "
    "message['content'] + '<|end|>\\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\\n' + message['content'] + "
    "'<|end|>\\n'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>\\n' + message['content'] + "
    "'<|end|>\\n'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ "
    "eos_token }}{% endif %}";

// Appends n_merges merges (and their tokens) built from letters and "Ġ"+letters:
// the left operand is any word piece (may start with Ġ), the right one a piece
// without Ġ, both drawn with a bias toward earlier (shorter) pieces.
void add_merges(SynthVocab& v, int64_t n_merges) {
  std::unordered_set<std::string> seen(v.tokens.begin(), v.tokens.end());
  std::vector<std::string> left, right;
  const std::string space = gpt2_byte_to_unicode(' ');
  left.push_back(space);
  for (char c = 'a'; c <= 'z'; ++c) {
    left.push_back(std::string(1, c));
    right.push_back(std::string(1, c));
  }
  Rng rng(0x5EED0B9Eull);
  int64_t made = 0;
  uint64_t attempts = 0;
  while (made < n_merges) {
    ++attempts;
    const double u1 = rng.uniform(), u2 = rng.uniform();
    const auto& a = left[static_cast<size_t>(static_cast<double>(left.size()) * u1 * u1)];
    const auto& b = right[static_cast<size_t>(static_cast<double>(right.size()) * u2 * u2)];
    std::string s = a + b;
    if (s.size() > 24 || seen.count(s)) continue;
    v.merges.push_back(a + " " + b);
    seen.insert(s);
    if (s.compare(0, space.size(), space) != 0) right.push_back(s);
    left.push_back(s);
    v.tokens.push_back(std::move(s));
    v.token_types.push_back(1);
    ++made;
  }
}

}  // namespace

std::string gpt2_byte_to_unicode(uint8_t b) {
  // Printable bytes stand for themselves; the other 68 map to 256, 257, ... in byte order.
  auto printable = [](int x) { return (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255); };
  uint32_t cp = b;
  if (!printable(b)) {
    uint32_t n = 0;
    for (int x = 0; x < b; ++x)
      if (!printable(x)) ++n;
    cp = 256 + n;
  }
  std::string s;
  append_utf8(s, cp);
  return s;
}

Expected<SynthVocab> make_synth_vocab(int64_t n_vocab, const std::string& pre, const std::string& arch) {
  SynthVocab v;
  std::vector<std::string> tail;  // specials after the merges
  int64_t n_pad = 0;
  // Places `specials` from real_first (the real model's id of the first one), padding
  // the rest of the vocabulary with [PADn], or last when the vocabulary is smaller
  // than the real one. Returns the id of the first special.
  auto specials_at = [&](const std::vector<std::string>& specials, int64_t real_first) -> int32_t {
    const int64_t n_spec = static_cast<int64_t>(specials.size());
    n_pad = n_vocab > real_first + n_spec ? n_vocab - (real_first + n_spec) : 0;
    tail = specials;
    return static_cast<int32_t>(n_vocab - n_pad - n_spec);
  };
  if (arch == "phi3") {
    // Phi-3's specials and chat format whatever the pre-tokenizer (the real files
    // use an SPM vocabulary; this one stays byte-level BPE so llama.cpp loads it alike).
    if (n_vocab < 256 + static_cast<int64_t>(kPhi3Specials.size()))
      return errorf("vocab size %lld is too small for phi3 (needs >= %lld)", (long long)n_vocab,
                    (long long)(256 + kPhi3Specials.size()));
    const int32_t first = specials_at(kPhi3Specials, 32000);
    v.bos = first;  // <|endoftext|>: Phi-3's GGUF eos; <|end|> ends a turn (an EOG by its text)
    v.eos = first;
    v.pad = first;
    v.chat_template = kPhi3Template;
  } else if (pre == "smollm") {
    if (n_vocab < 3 + 256) return errorf("vocab size %lld is too small for smollm (needs >= 259)", (long long)n_vocab);
    for (const char* s : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
      v.tokens.push_back(s);
      v.token_types.push_back(3);
    }
    v.unk = 0;
    v.bos = 1;
    v.eos = 2;
    v.pad = 2;
    v.chat_template = kChatML;
  } else if (pre == "llama-bpe") {
    // Below 512 entries only the 11 named specials fit beside the 256 bytes.
    const std::vector<std::string> all = llama3_specials();
    const size_t n_spec = n_vocab >= 256 + 256 ? all.size() : 11;
    if (n_vocab < 256 + static_cast<int64_t>(n_spec) + 1)
      return errorf("vocab size %lld is too small for llama-bpe (needs >= 268)", (long long)n_vocab);
    tail.assign(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(n_spec));
    const int32_t first = static_cast<int32_t>(n_vocab - static_cast<int64_t>(n_spec));
    v.bos = first;
    v.eos = first + 9;  // <|eot_id|>
    v.pad = first + 4;  // <|finetune_right_pad_id|>
    v.add_bos = true;
    v.chat_template = kLlama3Template;
  } else if (pre == "qwen2") {
    if (n_vocab < 256 + static_cast<int64_t>(kQwenSpecials.size()))
      return errorf("vocab size %lld is too small for qwen2 (needs >= %lld)", (long long)n_vocab,
                    (long long)(256 + kQwenSpecials.size()));
    const int32_t first = specials_at(kQwenSpecials, 151643);
    v.bos = first;      // <|endoftext|>
    v.eos = first + 2;  // <|im_end|>
    v.pad = first;
    v.chat_template = kChatML;
  } else {
    return errorf("unknown tokenizer pre '%s' (expected smollm, llama-bpe or qwen2)", pre.c_str());
  }
  for (int b = 0; b < 256; ++b) {
    v.tokens.push_back(gpt2_byte_to_unicode(static_cast<uint8_t>(b)));
    v.token_types.push_back(1);
  }
  const int64_t n_merges = n_vocab - static_cast<int64_t>(v.tokens.size()) - static_cast<int64_t>(tail.size()) - n_pad;
  v.tokens.reserve(static_cast<size_t>(n_vocab));
  v.token_types.reserve(static_cast<size_t>(n_vocab));
  v.merges.reserve(static_cast<size_t>(n_merges));
  add_merges(v, n_merges);
  for (const auto& s : tail) {
    v.tokens.push_back(s);
    v.token_types.push_back(3);
  }
  for (int64_t i = 0; i < n_pad; ++i) {
    v.tokens.push_back("[PAD" + std::to_string(v.tokens.size()) + "]");
    v.token_types.push_back(4);
  }
  return v;
}

}  // namespace pagoda::gguf
