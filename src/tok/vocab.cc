#include "tok/vocab.h"

#include <string_view>
#include <unordered_set>

#include "gguf/gguf.h"

namespace pagoda::tok {

namespace {

using gguf::Value;
using gguf::ValueType;

Expected<const Value*> find_array(const gguf::GgufFile& f, const std::string& key,
                                  bool required) {
  const Value* v = f.find(key);
  if (v == nullptr) {
    if (required) return errorf("tokenizer: GGUF key %s is missing", key.c_str());
    return static_cast<const Value*>(nullptr);
  }
  if (v->type != ValueType::ARRAY) {
    return errorf("tokenizer: GGUF key %s is of type %u, expected an array", key.c_str(),
                  static_cast<unsigned>(v->type));
  }
  return v;
}

// An optional per-token array (scores, token types): nullptr when absent, an
// error when it has fewer entries than the n_tokens tokens.
Expected<const Value*> find_per_token_array(const gguf::GgufFile& f, const std::string& key, size_t n_tokens) {
  PAGODA_ASSIGN_OR_RETURN(const Value* a, find_array(f, key, false));
  if (a != nullptr && a->arr.size() < n_tokens) {
    return errorf("tokenizer: %s has %zu entries for %zu tokens", key.c_str(), a->arr.size(), n_tokens);
  }
  return a;
}

// Reads an optional token id key; an id outside the vocabulary (e.g. 0xFFFFFFFF)
// keeps the default, as llama.cpp does ("bad special token ... using default id").
Status read_id(const gguf::GgufFile& f, const char* key, size_t n_vocab, TokenId* id) {
  const Value* v = f.find(key);
  if (v == nullptr) return Status::Ok();
  if (!v->is_int()) return errorf("tokenizer: GGUF key %s is not an integer", key);
  const int64_t x = v->as_int();
  if (x >= 0 && static_cast<uint64_t>(x) < n_vocab) *id = static_cast<TokenId>(x);
  return Status::Ok();
}

Status read_bool(const gguf::GgufFile& f, const char* key, bool* out) {
  const Value* v = f.find(key);
  if (v == nullptr) return Status::Ok();
  if (!v->is_int()) return errorf("tokenizer: GGUF key %s is not a bool", key);
  *out = v->as_int() != 0;
  return Status::Ok();
}

}  // namespace

Status finalize_vocab(Vocab& vocab) {
  const size_t n = vocab.tokens.size();
  if (n == 0) return make_error("tokenizer: empty vocabulary");
  if (n > static_cast<size_t>(INT32_MAX)) return errorf("tokenizer: vocabulary too large (%zu)", n);
  if (!vocab.scores.empty() && vocab.scores.size() != n) {
    return errorf("tokenizer: %zu scores for %zu tokens", vocab.scores.size(), n);
  }
  if (vocab.types.empty()) vocab.types.assign(n, TokenType::kNormal);
  if (vocab.types.size() != n) {
    return errorf("tokenizer: %zu token types for %zu tokens", vocab.types.size(), n);
  }
  std::unordered_set<std::string_view> seen;
  seen.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (vocab.tokens[i].empty()) vocab.tokens[i] = "[EMPTY_" + std::to_string(i) + "]";
  }
  for (size_t i = 0; i < n; ++i) {
    if (!seen.insert(vocab.tokens[i]).second) {
      return errorf("tokenizer: duplicate token '%s' (id %zu)", vocab.tokens[i].c_str(), i);
    }
  }
  const auto n_i = static_cast<TokenId>(n);
  for (TokenId* id : {&vocab.bos_id, &vocab.eos_id, &vocab.eot_id, &vocab.eom_id, &vocab.unk_id,
                      &vocab.pad_id}) {
    if (*id < 0 || *id >= n_i) *id = kNoToken;
  }
  if (vocab.eot_id == kNoToken) {
    // Chat models mark the end of a turn with one of these (llama.cpp's list).
    static const char* const kEotTexts[] = {"<|eot_id|>",    "<|im_end|>",    "<|end|>",
                                            "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
                                            "<EOT>",         "<end_of_utterance>"};
    for (const char* t : kEotTexts) {
      for (size_t i = 0; i < n && vocab.eot_id == kNoToken; ++i) {
        if (vocab.tokens[i] == t) vocab.eot_id = static_cast<TokenId>(i);
      }
      if (vocab.eot_id != kNoToken) break;
    }
  }
  if (vocab.add_bos && vocab.bos_id == kNoToken) {
    return make_error("tokenizer: add_bos_token is true but there is no BOS token");
  }
  if (vocab.add_eos && vocab.eos_id == kNoToken) {
    return make_error("tokenizer: add_eos_token is true but there is no EOS token");
  }
  return Status::Ok();
}

Expected<Vocab> vocab_from_gguf(const gguf::GgufFile& f) {
  Vocab v;
  const Value* model = f.find("tokenizer.ggml.model");
  if (model == nullptr || model->type != ValueType::STRING) {
    return make_error("tokenizer: GGUF key tokenizer.ggml.model is missing or not a string");
  }
  v.model = model->str;
  if (const Value* pre = f.find("tokenizer.ggml.pre"); pre && pre->type == ValueType::STRING) {
    v.pre = pre->str;
  }
  if (v.model == "llama") {
    v.kind = VocabKind::kSpm;
    v.bos_id = 1;
    v.eos_id = 2;
    v.unk_id = 0;
    v.add_bos = true;
    v.add_space_prefix = true;
  } else if (v.model == "gpt2") {
    v.kind = VocabKind::kBpe;
    v.bos_id = 11;  // llama.cpp's defaults for gpt2 vocabularies
    v.eos_id = 11;
    if (v.pre == "llama3" || v.pre == "llama-v3" || v.pre == "llama-bpe" || v.pre == "tekken") {
      v.add_bos = true;
    }
  } else {
    return errorf("tokenizer: unsupported tokenizer.ggml.model '%s' (supported: llama, gpt2)",
                  v.model.c_str());
  }

  PAGODA_ASSIGN_OR_RETURN(const Value* tokens, find_array(f, "tokenizer.ggml.tokens", true));
  if (tokens->elem_type != ValueType::STRING) {
    return make_error("tokenizer: tokenizer.ggml.tokens is not an array of strings");
  }
  const size_t n = tokens->arr.size();
  v.tokens.reserve(n);
  for (const Value& t : tokens->arr) v.tokens.push_back(t.str);

  PAGODA_ASSIGN_OR_RETURN(const Value* scores, find_per_token_array(f, "tokenizer.ggml.scores", n));
  if (scores != nullptr) {
    v.scores.reserve(n);
    for (size_t i = 0; i < n; ++i) v.scores.push_back(static_cast<float>(scores->arr[i].as_float()));
  }
  PAGODA_ASSIGN_OR_RETURN(const Value* types, find_per_token_array(f, "tokenizer.ggml.token_type", n));
  if (types != nullptr) {
    v.types.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      const int64_t t = types->arr[i].is_int() ? types->arr[i].as_int() : 0;
      v.types.push_back(t >= 0 && t <= 6 ? static_cast<TokenType>(t) : TokenType::kUndefined);
    }
  }
  if (v.kind == VocabKind::kBpe) {
    PAGODA_ASSIGN_OR_RETURN(const Value* merges, find_array(f, "tokenizer.ggml.merges", true));
    if (merges->elem_type != ValueType::STRING) {
      return make_error("tokenizer: tokenizer.ggml.merges is not an array of strings");
    }
    v.merges.reserve(merges->arr.size());
    for (const Value& m : merges->arr) v.merges.push_back(m.str);
  }

  PAGODA_TRY(read_id(f, "tokenizer.ggml.bos_token_id", n, &v.bos_id));
  PAGODA_TRY(read_id(f, "tokenizer.ggml.eos_token_id", n, &v.eos_id));
  PAGODA_TRY(read_id(f, "tokenizer.ggml.eot_token_id", n, &v.eot_id));
  PAGODA_TRY(read_id(f, "tokenizer.ggml.eom_token_id", n, &v.eom_id));
  PAGODA_TRY(read_id(f, "tokenizer.ggml.unknown_token_id", n, &v.unk_id));
  PAGODA_TRY(read_id(f, "tokenizer.ggml.padding_token_id", n, &v.pad_id));
  PAGODA_TRY(read_bool(f, "tokenizer.ggml.add_bos_token", &v.add_bos));
  PAGODA_TRY(read_bool(f, "tokenizer.ggml.add_eos_token", &v.add_eos));
  PAGODA_TRY(read_bool(f, "tokenizer.ggml.add_space_prefix", &v.add_space_prefix));
  if (const Value* t = f.find("tokenizer.chat_template"); t && t->type == ValueType::STRING) {
    v.chat_template = t->str;
  }
  PAGODA_TRY(finalize_vocab(v));
  return v;
}

}  // namespace pagoda::tok
