// The state of one /v1/messages request between the engine's callbacks and the
// client (one prompt, one choice): Anthropic's message object, or its SSE event
// sequence (message_start, content_block_start, ping, content_block_delta,
// content_block_stop, message_delta, message_stop; `error` on failure). Engine
// callbacks and on_disconnect are serialized by the object's mutex; every send
// goes through the Responder. The OpenAI shapes are generation.h's.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "http/http.h"
#include "openai/openai_api.h"

namespace pagoda::server {

class Metrics;
class TextCodec;

struct MessagesSetup {
  std::string id;      // "msg_..."
  std::string model;
  bool stream = false;
  int32_t prompt_tokens = 0;
  int32_t pin_tokens = 0;  // the cache_control breakpoint's position (0: none)
  std::vector<std::string> tool_names;  // tools in play (auto, any or tool): calls become tool_use blocks
  std::vector<std::string> stop_sequences;
  bool log_access = true;
  double t_start = 0;
};

class MessagesGeneration {
 public:
  MessagesGeneration(MessagesSetup setup, const TextCodec& text, Metrics& metrics, std::shared_ptr<Responder> res);
  void on_added(const std::string& error);
  void on_event(size_t prompt, const engine::TokenEvent& ev);
  bool on_disconnect();
  const std::string& id() const { return s_.id; }

 private:
  void fail(const ApiError& e);  // mu_ held
  void finish();                 // mu_ held
  // Streaming: opens the next content block (writing a ping after the first).
  void start_block(const json& block);
  void stop_block();
  void stream_text(const std::string& text);
  // Streaming with tools: holds text that may become a call; true when handled.
  bool stream_tool_event(const engine::TokenEvent& ev);
  // The stop_sequence that ended the output, "" for none (end of turn / EOS).
  std::string matched_stop() const;
  std::string stop_reason(bool tool_use) const;
  json usage() const;
  json tool_use_block(const std::string& name, const std::string& arguments, size_t k, bool with_input) const;
  void access_log(int status, const std::string& finish, const std::string& error) const;

  MessagesSetup s_;
  const TextCodec& text_;
  Metrics& metrics_;
  std::shared_ptr<Responder> res_;  // released once the response has ended
  std::mutex mu_;
  std::string text_out_;            // the output text (stop strings cut)
  std::vector<int32_t> tokens_;     // the output tokens (to tell which stop sequence matched)
  engine::FinishReason finish_ = engine::FinishReason::kNone;
  int64_t cached_tokens_ = 0;
  bool started_ = false;            // message_start written
  bool holding_ = true;             // tools: output held while it may be a call
  std::string held_;
  int next_block_ = 0;              // index of the next content block
  bool block_open_ = false;
  bool pinged_ = false;
  bool tool_blocks_ = false;        // streaming: tool_use blocks were sent
  double t_first_ = 0;
  bool done_ = false;
};

}  // namespace pagoda::server
