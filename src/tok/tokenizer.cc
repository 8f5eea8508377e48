#include "tok/tokenizer.h"

#include <algorithm>
#include <optional>
#include <queue>

#include "gguf/gguf.h"
#include "tok/unicode.h"

namespace pagoda::tok {

namespace {

constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's space

// One symbol of a word being merged: a byte range of the working string, linked
// to its neighbours; n == 0 once merged into the symbol on its left.
struct Symbol {
  int prev;
  int next;
  size_t off;
  size_t n;
};

// Merges adjacent symbols of *sym, the pair of lowest cost first (ties: the
// leftmost pair, as llama.cpp's llm_bigram_spm / llm_bigram_bpe), until no pair
// merges. cost(left, right): the pair's cost, nullopt when it does not merge.
// A queued pair made stale by an earlier merge is skipped.
template <class Cost>
void merge_symbols(std::vector<Symbol>* sym_ptr, Cost cost) {
  std::vector<Symbol>& sym = *sym_ptr;
  struct Bigram {
    int left;
    int right;
    double cost;
    size_t size;  // l.n + r.n when queued: a merge since changes it
  };
  auto worse = [](const Bigram& a, const Bigram& b) {
    return a.cost > b.cost || (a.cost == b.cost && a.left > b.left);
  };
  std::priority_queue<Bigram, std::vector<Bigram>, decltype(worse)> queue(worse);
  auto try_add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const Symbol& l = sym[static_cast<size_t>(left)];
    const Symbol& r = sym[static_cast<size_t>(right)];
    if (const std::optional<double> c = cost(l, r)) queue.push({left, right, *c, l.n + r.n});
  };
  for (int i = 1; i < static_cast<int>(sym.size()); ++i) try_add(i - 1, i);

  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    Symbol& l = sym[static_cast<size_t>(b.left)];
    Symbol& r = sym[static_cast<size_t>(b.right)];
    if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) continue;  // stale
    l.n += r.n;
    r.n = 0;
    l.next = r.next;
    if (r.next >= 0) sym[static_cast<size_t>(r.next)].prev = b.left;
    try_add(l.prev, b.left);
    try_add(b.left, l.next);
  }
}

// fn(text) for each symbol left after merge_symbols, in order; text is its
// range of the working string s.
template <class Fn>
void for_each_merged(const std::vector<Symbol>& sym, std::string_view s, Fn fn) {
  for (int i = 0; i != -1; i = sym[static_cast<size_t>(i)].next) {
    fn(s.substr(sym[static_cast<size_t>(i)].off, sym[static_cast<size_t>(i)].n));
  }
}

// "<0xNN>" -> NN, or -1.
int parse_byte_token(std::string_view t) {
  if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return -1;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  const int hi = hex(t[3]), lo = hex(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

// Byte-level BPE token text -> bytes (each code point is the image of one byte).
std::string bpe_text_to_bytes(std::string_view t) {
  std::string out;
  for (size_t i = 0; i < t.size();) {
    const size_t len = utf8_valid_len(t, i);
    if (len == 0) {
      out.push_back(t[i++]);
      continue;
    }
    const int b = unicode_to_byte(utf8_decode(t, i, len));
    if (b >= 0) {
      out.push_back(static_cast<char>(b));
    } else {
      out.append(t.data() + i, len);  // not a mapped byte: keep the character
    }
    i += len;
  }
  return out;
}

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    if (s.compare(i, from.size(), from) == 0) {
      out += to;
      i += from.size();
    } else {
      out.push_back(s[i++]);
    }
  }
  return out;
}

}  // namespace

Expected<std::unique_ptr<Tokenizer>> Tokenizer::create(Vocab vocab) {
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  t->vocab_ = std::move(vocab);
  PAGODA_TRY(finalize_vocab(t->vocab_));
  PAGODA_TRY(t->init());
  return t;
}

Expected<std::unique_ptr<Tokenizer>> Tokenizer::from_gguf(const gguf::GgufFile& file) {
  PAGODA_ASSIGN_OR_RETURN(Vocab v, vocab_from_gguf(file));
  return create(std::move(v));
}

Status Tokenizer::init() {
  const size_t n = vocab_.tokens.size();
  token_ids_.reserve(n);
  for (size_t i = 0; i < n; ++i) token_ids_.emplace(vocab_.tokens[i], static_cast<int32_t>(i));

  if (vocab_.kind == VocabKind::kBpe) {
    PAGODA_ASSIGN_OR_RETURN(pretok_, PreTokenizer::for_name(vocab_.pre));
    const std::string& pre = vocab_.pre;
    ignore_merges_ = pre == "llama3" || pre == "llama-bpe" || pre == "llama-v3";
    bpe_ranks_.reserve(vocab_.merges.size());
    for (size_t i = 0; i < vocab_.merges.size(); ++i) {
      // The first space after position 0 separates the two halves (llama.cpp);
      // byte-level texts never contain a raw space, so the line is the key.
      bpe_ranks_.emplace(vocab_.merges[i], static_cast<int32_t>(i));
    }
  }

  for (size_t i = 0; i < n; ++i) {
    const TokenType t = vocab_.types[i];
    if (t == TokenType::kControl || t == TokenType::kUserDefined || t == TokenType::kUnknown) {
      special_.push_back(static_cast<TokenId>(i));
    }
  }
  std::stable_sort(special_.begin(), special_.end(), [&](TokenId a, TokenId b) {
    return vocab_.tokens[static_cast<size_t>(a)].size() > vocab_.tokens[static_cast<size_t>(b)].size();
  });

  for (int b = 0; b < 256; ++b) {
    byte_tokens_[b] = kNoToken;
    char hexbuf[8];
    std::snprintf(hexbuf, sizeof(hexbuf), "<0x%02X>", b);
    TokenId id = find_token(hexbuf);
    if (id == kNoToken) id = find_token(std::string(1, static_cast<char>(b)));
    byte_tokens_[b] = id;
  }

  pieces_.resize(n);
  pieces_special_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const std::string& text = vocab_.tokens[i];
    std::string piece;
    switch (vocab_.types[i]) {
      case TokenType::kNormal:
        piece = vocab_.kind == VocabKind::kSpm ? replace_all(text, kSpace, " ") : bpe_text_to_bytes(text);
        break;
      case TokenType::kByte: {
        const int b = parse_byte_token(text);
        if (b >= 0) piece.assign(1, static_cast<char>(b));
        break;
      }
      case TokenType::kUserDefined:
        piece = text;
        break;
      default:  // control, unknown: shown only on request; unused/undefined: never
        break;
    }
    const TokenType t = vocab_.types[i];
    pieces_special_[i] = (t == TokenType::kControl || t == TokenType::kUnknown) ? text : piece;
    pieces_[i] = std::move(piece);
  }

  eog_.assign(n, 0);
  auto add_eog = [&](TokenId id) {
    if (id >= 0 && static_cast<size_t>(id) < n && !eog_[static_cast<size_t>(id)]) {
      eog_[static_cast<size_t>(id)] = 1;
      eog_ids_.push_back(id);
    }
  };
  add_eog(vocab_.eos_id);
  add_eog(vocab_.eot_id);
  add_eog(vocab_.eom_id);
  static const char* const kEogTexts[] = {"<|eot_id|>",     "<|im_end|>",      "<|end|>",
                                          "<end_of_turn>",  "<|endoftext|>",   "<|eom_id|>",
                                          "<EOT>",          "<|end_of_text|>", "<end_of_utterance>"};
  for (const char* text : kEogTexts) add_eog(find_token(text));
  std::sort(eog_ids_.begin(), eog_ids_.end());
  return Status::Ok();
}

TokenId Tokenizer::find_token(std::string_view text) const {
  auto it = token_ids_.find(text);
  return it == token_ids_.end() ? kNoToken : it->second;
}

TokenId Tokenizer::text_token(std::string_view text) const {
  const TokenId id = find_token(text);
  if (id == kNoToken) return kNoToken;
  // Byte tokens ("<0x41>") only come from byte fallback, never from spelling them.
  const TokenType t = vocab_.types[static_cast<size_t>(id)];
  return (t == TokenType::kControl || t == TokenType::kUnknown || t == TokenType::kByte) ? kNoToken : id;
}

bool Tokenizer::is_eog(TokenId id) const {
  return id >= 0 && id < vocab_size() && eog_[static_cast<size_t>(id)] != 0;
}

bool Tokenizer::is_control(TokenId id) const {
  const TokenType t = token_type(id);
  return t == TokenType::kControl || t == TokenType::kUnknown;
}

TokenType Tokenizer::token_type(TokenId id) const {
  if (id < 0 || id >= vocab_size()) return TokenType::kUndefined;
  return vocab_.types[static_cast<size_t>(id)];
}

const std::string& Tokenizer::token_to_piece(TokenId id, bool render_special) const {
  static const std::string kEmpty;
  if (id < 0 || id >= vocab_size()) return kEmpty;
  return render_special ? pieces_special_[static_cast<size_t>(id)] : pieces_[static_cast<size_t>(id)];
}

std::string Tokenizer::decode(std::span<const TokenId> ids, const DecodeOptions& opts) const {
  std::string out;
  bool strip = opts.strip_leading_space && adds_space_prefix();
  for (TokenId id : ids) {
    const std::string& p = token_to_piece(id, opts.render_special);
    if (strip && !is_control(id) && !p.empty()) {
      strip = false;
      if (p[0] == ' ') {
        out.append(p, 1, std::string::npos);
        continue;
      }
    }
    out += p;
  }
  return out;
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool add_special,
                                       bool parse_special) const {
  return encode_impl(text, add_special, parse_special, {});
}

std::vector<TokenId> Tokenizer::encode_with_plain_spans(std::string_view text, std::span<const ByteSpan> plain,
                                                        bool add_special) const {
  return encode_impl(text, add_special, /*parse_special=*/true, plain);
}

std::vector<TokenId> Tokenizer::encode_impl(std::string_view text, bool add_special, bool parse_special,
                                            std::span<const ByteSpan> plain) const {
  // True when [b, e) overlaps a plain span (binary search: spans are sorted).
  auto in_plain = [&](size_t b, size_t e) {
    auto it = std::upper_bound(plain.begin(), plain.end(), b,
                               [](size_t x, const ByteSpan& s) { return x < s.end; });
    return it != plain.end() && it->begin < e;
  };
  // Fragments: raw text ranges and special tokens, in order.
  struct Frag {
    TokenId id;  // kNoToken: raw text [off, off + len)
    size_t off;
    size_t len;
  };
  std::vector<Frag> frags, next;
  if (!text.empty()) frags.push_back({kNoToken, 0, text.size()});
  for (TokenId sid : special_) {
    const TokenType t = vocab_.types[static_cast<size_t>(sid)];
    const bool control = t == TokenType::kControl || t == TokenType::kUnknown;
    if (!parse_special && control) continue;
    const std::string& st = vocab_.tokens[static_cast<size_t>(sid)];
    next.clear();
    bool changed = false;
    for (const Frag& f : frags) {
      if (f.id != kNoToken) {
        next.push_back(f);
        continue;
      }
      const std::string_view window = text.substr(0, f.off + f.len);
      size_t pos = f.off;
      for (size_t m, from = pos; (m = window.find(st, from)) != std::string_view::npos;) {
        if (control && !plain.empty() && in_plain(m, m + st.size())) {
          from = m + 1;  // spelled inside message content: stays text
          continue;
        }
        if (m > pos) next.push_back({kNoToken, pos, m - pos});
        next.push_back({sid, 0, 0});
        pos = m + st.size();
        from = pos;
        changed = true;
      }
      if (pos < f.off + f.len) next.push_back({kNoToken, pos, f.off + f.len - pos});
    }
    if (changed) frags.swap(next);
  }

  std::vector<TokenId> out;
  if (add_special && vocab_.add_bos) out.push_back(vocab_.bos_id);
  bool prev_special = true;  // SPM: the first fragment gets a space prefix too
  for (const Frag& f : frags) {
    if (f.id != kNoToken) {
      out.push_back(f.id);
      prev_special = true;
      continue;
    }
    const std::string_view frag = text.substr(f.off, f.len);
    if (vocab_.kind == VocabKind::kSpm) {
      encode_spm(frag, vocab_.add_space_prefix && prev_special, &out);
    } else {
      encode_bpe(frag, &out);
    }
    prev_special = false;
  }
  if (add_special && vocab_.add_eos) out.push_back(vocab_.eos_id);
  return out;
}

void Tokenizer::encode_spm(std::string_view fragment, bool prefix_space,
                           std::vector<TokenId>* out) const {
  std::string s;
  s.reserve(fragment.size() + 3);
  if (prefix_space) s += kSpace;
  for (char c : fragment) {
    if (c == ' ') {
      s += kSpace;
    } else {
      s.push_back(c);
    }
  }
  if (s.empty()) return;

  // One symbol per UTF-8 character; a byte that is not valid UTF-8 stands alone.
  std::vector<Symbol> sym;
  for (size_t off = 0; off < s.size();) {
    size_t len = utf8_valid_len(s, off);
    if (len == 0) len = 1;
    const int idx = static_cast<int>(sym.size());
    sym.push_back({idx - 1, off + len == s.size() ? -1 : idx + 1, off, len});
    off += len;
  }

  // Highest score first (llama.cpp's llm_bigram_spm): the cost is -score.
  merge_symbols(&sym, [&](const Symbol& l, const Symbol& r) -> std::optional<double> {
    const TokenId id = text_token(std::string_view(s).substr(l.off, l.n + r.n));
    if (id == kNoToken) return std::nullopt;
    return -static_cast<double>(vocab_.scores.empty() ? 0.0f : vocab_.scores[static_cast<size_t>(id)]);
  });

  for_each_merged(sym, s, [&](std::string_view text) {
    if (const TokenId id = text_token(text); id != kNoToken) {
      out->push_back(id);
      return;
    }
    for (char c : text) {  // byte fallback
      const TokenId bt = byte_tokens_[static_cast<uint8_t>(c)];
      if (bt != kNoToken) {
        out->push_back(bt);
      } else if (vocab_.unk_id != kNoToken) {
        out->push_back(vocab_.unk_id);
      }
    }
  });
}

void Tokenizer::encode_bpe(std::string_view fragment, std::vector<TokenId>* out) const {
  std::vector<std::string_view> words;
  pretok_.split(fragment, &words);
  for (std::string_view w : words) encode_bpe_word(w, out);
}

void Tokenizer::encode_bpe_word(std::string_view word, std::vector<TokenId>* out) const {
  if (word.empty()) return;
  // Byte-level: every byte becomes one printable code point, one symbol each.
  std::string s;
  s.reserve(word.size() * 2);
  std::vector<Symbol> sym;
  sym.reserve(word.size());
  for (size_t i = 0; i < word.size(); ++i) {
    const std::string& u = byte_to_unicode(static_cast<uint8_t>(word[i]));
    const int idx = static_cast<int>(i);
    sym.push_back({idx - 1, i + 1 == word.size() ? -1 : idx + 1, s.size(), u.size()});
    s += u;
  }
  if (ignore_merges_) {
    const TokenId id = text_token(s);
    if (id != kNoToken) {
      out->push_back(id);
      return;
    }
  }

  // Lowest merge rank first (llama.cpp's llm_bigram_bpe).
  std::string key;
  merge_symbols(&sym, [&](const Symbol& l, const Symbol& r) -> std::optional<double> {
    key.assign(s, l.off, l.n);
    key.push_back(' ');
    key.append(s, r.off, r.n);
    auto it = bpe_ranks_.find(key);
    if (it == bpe_ranks_.end()) return std::nullopt;
    return static_cast<double>(it->second);
  });

  for_each_merged(sym, s, [&](std::string_view text) {
    if (const TokenId id = text_token(text); id != kNoToken) {
      out->push_back(id);
      return;
    }
    // A merge result missing from the vocabulary: one token per byte's character.
    for (size_t j = 0; j < text.size();) {
      size_t len = utf8_valid_len(text, j);
      if (len == 0) len = 1;
      const TokenId bt = text_token(text.substr(j, len));
      if (bt != kNoToken) out->push_back(bt);
      j += len;
    }
  });
}

}  // namespace pagoda::tok
