// SmolLM2's chat template for the tok/ tests that render real prompts
// (test_chat_template.cc, test_chat_taint.cc). A header of its own: it reports
// through GoogleTest, and tok_test_util.cc is also linked into tools without it.
#pragma once
#include <gtest/gtest.h>

#include <string>

#include "tok/chat_template.h"
#include "tok/tok_test_util.h"

namespace pagoda::tok::testing {

// SmolLM2's chat template from its GGUF, parsed once: nullptr when the model is
// missing (*why says so); a template that does not parse also fails the test.
inline const ChatTemplate* smollm2_template(std::string* why) {
  const Tokenizer* t = smollm2(why);
  if (t == nullptr) return nullptr;
  static const Expected<ChatTemplate> tmpl = ChatTemplate::from_tokenizer(*t);
  if (!tmpl.ok()) {
    ADD_FAILURE() << "SmolLM2's chat template: " << tmpl.message();
    if (why) *why = tmpl.message();
    return nullptr;
  }
  return &*tmpl;
}

}  // namespace pagoda::tok::testing
