#include "server/anthropic_generation.h"

#include <algorithm>

#include "base/log.h"
#include "base/timer.h"
#include "openai/anthropic_api.h"
#include "server/metrics.h"
#include "openai/structured.h"
#include "openai/text.h"

namespace pagoda::server {

namespace {
// Streamed tool input goes out in fragments of this many bytes (cut at UTF-8
// character starts), as input_json_delta events.
constexpr size_t kInputFragment = 32;
}  // namespace

MessagesGeneration::MessagesGeneration(MessagesSetup setup, const TextCodec& text, Metrics& metrics,
                                       std::shared_ptr<Responder> res)
    : s_(std::move(setup)), text_(text), metrics_(metrics), res_(std::move(res)) {}

void MessagesGeneration::access_log(int status, const std::string& finish, const std::string& error) const {
  if (!s_.log_access) return;
  char ttft[32] = "-";
  if (t_first_ > 0) std::snprintf(ttft, sizeof ttft, "%.3fs", t_first_ - s_.t_start);
  PAGODA_LOG_INFO("%s /v1/messages status=%d prompt_tokens=%d output_tokens=%zu cached_tokens=%lld pin_tokens=%d "
                  "ttft=%s duration=%.3fs finish=%s%s%s",
                  s_.id.c_str(), status, s_.prompt_tokens, tokens_.size(), static_cast<long long>(cached_tokens_),
                  s_.pin_tokens, ttft, now_seconds() - s_.t_start, finish.c_str(), error.empty() ? "" : " error=",
                  error.c_str());
}

void MessagesGeneration::on_added(const std::string& error) {
  std::lock_guard<std::mutex> l(mu_);
  if (done_) return;
  if (!error.empty()) {
    // Nothing was sent yet, streaming or not: a plain 400.
    access_log(400, "error", error);
    done_ = true;
    metrics_.inc_counter("pagoda:request_failure_total", 1, "400");
    res_->send(400, "application/json", anthropic_error_body(ApiError{400, error, "invalid_request_error", "", ""}));
    res_.reset();
    return;
  }
  if (s_.stream) res_->start_stream(200);
}

bool MessagesGeneration::on_disconnect() {
  std::lock_guard<std::mutex> l(mu_);
  const bool running = !done_;
  if (running) access_log(499, "abort", "client disconnected");
  done_ = true;
  res_.reset();
  return running;
}

void MessagesGeneration::fail(const ApiError& e) {
  access_log(s_.stream ? 200 : anthropic_status(e), "error", e.message);
  done_ = true;
  if (s_.stream) {
    // The 200 header is out: the error travels as an `error` event, then the stream ends.
    res_->write(anthropic_sse("error", json::parse(anthropic_error_body(e))));
    res_->end_stream();
  } else {
    metrics_.inc_counter("pagoda:request_failure_total", 1, std::to_string(anthropic_status(e)));
    res_->send(anthropic_status(e), "application/json", anthropic_error_body(e));
  }
  res_.reset();
}

json MessagesGeneration::usage() const {
  return usage_json(messages_usage(s_.prompt_tokens, cached_tokens_, s_.pin_tokens,
                                   static_cast<int64_t>(tokens_.size())));
}

void MessagesGeneration::on_event(size_t /*prompt*/, const engine::TokenEvent& ev) {
  std::lock_guard<std::mutex> l(mu_);
  if (done_) return;
  if (ev.finish == engine::FinishReason::kError)
    return fail(ApiError{500, ev.error.empty() ? "request failed" : ev.error, "api_error", "", ""});
  if (ev.index != 0) return;  // n is 1
  if (!started_) {
    // The first event carries the prompt tokens read from the prefix cache.
    started_ = true;
    cached_tokens_ = ev.num_cached_tokens;
    if (s_.stream) {
      json msg = {{"id", s_.id},        {"type", "message"},      {"role", "assistant"},
                  {"model", s_.model},  {"content", json::array()}, {"stop_reason", nullptr},
                  {"stop_sequence", nullptr}, {"usage", usage()}};
      res_->write(anthropic_sse("message_start", json{{"type", "message_start"}, {"message", std::move(msg)}}));
    }
  }
  if (t_first_ == 0 && !ev.tokens.empty()) t_first_ = now_seconds();
  tokens_.insert(tokens_.end(), ev.tokens.begin(), ev.tokens.end());
  text_out_ += ev.text;
  finish_ = ev.finish;
  if (s_.stream && (s_.tool_names.empty() || !stream_tool_event(ev))) stream_text(ev.text);
  if (ev.finish != engine::FinishReason::kNone) finish();
}

void MessagesGeneration::start_block(const json& block) {
  res_->write(anthropic_sse("content_block_start",
                            json{{"type", "content_block_start"}, {"index", next_block_}, {"content_block", block}}));
  block_open_ = true;
  if (!pinged_) {
    pinged_ = true;
    res_->write(anthropic_sse("ping", json{{"type", "ping"}}));
  }
}

void MessagesGeneration::stop_block() {
  if (!block_open_) return;
  res_->write(anthropic_sse("content_block_stop", json{{"type", "content_block_stop"}, {"index", next_block_}}));
  block_open_ = false;
  ++next_block_;
}

void MessagesGeneration::stream_text(const std::string& text) {
  if (text.empty()) return;
  if (!block_open_) start_block(json{{"type", "text"}, {"text", ""}});
  res_->write(anthropic_sse("content_block_delta", json{{"type", "content_block_delta"},
                                                        {"index", next_block_},
                                                        {"delta", {{"type", "text_delta"}, {"text", text}}}}));
}

json MessagesGeneration::tool_use_block(const std::string& name, const std::string& arguments, size_t k,
                                        bool with_input) const {
  json input = json::object();
  if (with_input) {
    input = json::parse(arguments, nullptr, false);
    if (input.is_discarded() || !input.is_object()) input = json::object();
  }
  // The message id is random per request: tool_use ids are unique per response.
  const std::string id = "toolu_" + s_.id.substr(s_.id.find('_') + 1) + "_" + std::to_string(k);
  return json{{"type", "tool_use"}, {"id", id}, {"name", name}, {"input", std::move(input)}};
}

bool MessagesGeneration::stream_tool_event(const engine::TokenEvent& ev) {
  if (!holding_) return false;
  held_ += ev.text;
  if (ev.finish == engine::FinishReason::kNone && may_be_tool_call(held_)) return true;
  holding_ = false;
  ToolParse tp;
  if (ev.finish != engine::FinishReason::kNone) tp = parse_tool_calls(held_, s_.tool_names);
  if (tp.calls.empty()) {
    stream_text(held_);  // plain text after all
  } else {
    if (!tp.content.empty()) {
      stream_text(tp.content);
      stop_block();
    }
    tool_blocks_ = true;
    for (size_t k = 0; k < tp.calls.size(); ++k) {
      const ToolCall& call = tp.calls[k];
      start_block(tool_use_block(call.name, call.arguments, k, /*with_input=*/false));
      for (size_t off = 0; off < call.arguments.size();) {
        size_t end = std::min(call.arguments.size(), off + kInputFragment);
        while (end < call.arguments.size() && (static_cast<unsigned char>(call.arguments[end]) & 0xC0) == 0x80) ++end;
        res_->write(anthropic_sse(
            "content_block_delta",
            json{{"type", "content_block_delta"},
                 {"index", next_block_},
                 {"delta", {{"type", "input_json_delta"}, {"partial_json", call.arguments.substr(off, end - off)}}}}));
        off = end;
      }
      stop_block();
    }
  }
  held_.clear();
  return true;
}

std::string MessagesGeneration::matched_stop() const {
  if (finish_ != engine::FinishReason::kStop || s_.stop_sequences.empty()) return "";
  // The engine cuts the output at the first occurrence of any stop sequence: the
  // whole output decoded again holds it, and no earlier one.
  const std::string full = text_.decode(tokens_);
  std::string best;
  size_t best_pos = std::string::npos;
  for (const std::string& s : s_.stop_sequences) {
    const size_t pos = full.find(s);
    if (pos < best_pos) {
      best_pos = pos;
      best = s;
    }
  }
  return best;
}

std::string MessagesGeneration::stop_reason(bool tool_use) const {
  if (tool_use) return "tool_use";
  if (finish_ == engine::FinishReason::kLength) return "max_tokens";
  if (!matched_stop().empty()) return "stop_sequence";
  return "end_turn";
}

void MessagesGeneration::finish() {
  done_ = true;
  json content = json::array();
  bool tool_use = false;
  if (!s_.tool_names.empty()) {
    ToolParse tp = parse_tool_calls(text_out_, s_.tool_names);
    tool_use = !tp.calls.empty();
    if (tool_use) {
      if (!tp.content.empty()) content.push_back(json{{"type", "text"}, {"text", tp.content}});
      for (size_t k = 0; k < tp.calls.size(); ++k)
        content.push_back(tool_use_block(tp.calls[k].name, tp.calls[k].arguments, k, /*with_input=*/true));
    }
  }
  if (s_.stream) tool_use = tool_blocks_;  // what the stream sent (text released early stays text)
  if (!tool_use && !text_out_.empty()) content.push_back(json{{"type", "text"}, {"text", text_out_}});
  const std::string reason = stop_reason(tool_use);
  const std::string stop_seq = reason == "stop_sequence" ? matched_stop() : "";
  const json stop_seq_json = stop_seq.empty() ? json() : json(stop_seq);
  access_log(200, reason, "");
  if (s_.stream) {
    stop_block();
    if (!pinged_) res_->write(anthropic_sse("ping", json{{"type", "ping"}}));
    json delta = {{"stop_reason", reason}, {"stop_sequence", stop_seq_json}};
    res_->write(anthropic_sse("message_delta",
                              json{{"type", "message_delta"}, {"delta", std::move(delta)}, {"usage", usage()}}));
    res_->write(anthropic_sse("message_stop", json{{"type", "message_stop"}}));
    res_->end_stream();
  } else {
    json j = {{"id", s_.id},           {"type", "message"},        {"role", "assistant"},
              {"model", s_.model},     {"content", std::move(content)}, {"stop_reason", reason},
              {"stop_sequence", stop_seq_json}, {"usage", usage()}};
    res_->send(200, "application/json", dump_json(j));
  }
  res_.reset();
}

}  // namespace pagoda::server
