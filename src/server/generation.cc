#include "server/generation.h"

#include "base/log.h"
#include "base/timer.h"
#include "server/metrics.h"
#include "openai/text.h"
#include "tok/tokenizer.h"

namespace pagoda::server {

namespace {

// OpenAI's message.tool_calls entry.
json tool_call_json(const ToolCall& c, const std::string& id) {
  return json{{"id", id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}};
}

// Streamed arguments go out in fragments of this many bytes (cut at UTF-8
// character starts), the way OpenAI streams them.
constexpr size_t kArgumentFragment = 32;

}  // namespace

std::string Generation::call_id(size_t ci, size_t k) const {
  // The response id is random per request: call ids are unique per response.
  const std::string& id = s_.meta.id;
  return "call_" + id.substr(id.find('-') + 1) + "_" + std::to_string(ci) + "_" + std::to_string(k);
}

bool Generation::stream_tool_event(size_t ci, const engine::TokenEvent& ev) {
  Choice& c = choices_[ci];
  if (!c.holding) return false;
  c.held += ev.text;
  c.held_logprobs.insert(c.held_logprobs.end(), ev.logprobs.begin(), ev.logprobs.end());
  const Endpoint ep = s_.meta.endpoint;
  auto send = [&](json delta, json finish) {
    json choice = json{{"index", ci}, {"delta", std::move(delta)}, {"logprobs", nullptr}, {"finish_reason", finish}};
    res_->write(sse(chunk_json(s_.meta, json::array({std::move(choice)}))));
  };
  if (ev.finish == engine::FinishReason::kNone && may_be_tool_call(c.held)) return true;
  c.holding = false;
  ToolParse tp;
  if (ev.finish != engine::FinishReason::kNone) tp = parse_tool_calls(c.held, s_.tool_names);
  if (tp.calls.empty()) {
    // Plain content after all: send what was held as one content delta.
    json lp = c.held_logprobs.empty() ? json() : logprobs_json(ep, text_.tokenizer(), c.held_logprobs, 0);
    res_->write(sse(chunk_json(s_.meta, json::array({stream_choice_json(ep, ci, c.held, !c.first_sent,
                                                                        std::move(lp), ev.finish)}))));
  } else {
    // OpenAI's shape: per call, {index, id, type, function{name, arguments: ""}},
    // then argument fragments {index, function{arguments}}; then the finish.
    json first = json{{"role", "assistant"}, {"content", tp.content.empty() ? json() : json(tp.content)}};
    send(first, nullptr);
    for (size_t k = 0; k < tp.calls.size(); ++k) {
      const ToolCall& call = tp.calls[k];
      send(json{{"tool_calls", json::array({json{{"index", k}, {"id", call_id(ci, k)}, {"type", "function"},
                                                 {"function", {{"name", call.name}, {"arguments", ""}}}}})}},
           nullptr);
      for (size_t off = 0; off < call.arguments.size();) {
        size_t end = std::min(call.arguments.size(), off + kArgumentFragment);
        while (end < call.arguments.size() && (static_cast<unsigned char>(call.arguments[end]) & 0xC0) == 0x80) ++end;
        send(json{{"tool_calls",
                   json::array({json{{"index", k}, {"function", {{"arguments", call.arguments.substr(off, end - off)}}}}})}},
             nullptr);
        off = end;
      }
    }
    send(json::object(), "tool_calls");
  }
  c.first_sent = true;
  c.held.clear();
  c.held_logprobs.clear();
  return true;
}

Generation::Generation(GenerationSetup setup, const TextCodec& text, Metrics& metrics, std::shared_ptr<Responder> res)
    : s_(std::move(setup)), text_(text), metrics_(metrics), res_(std::move(res)) {
  choices_.resize(s_.prompt_lens.size() * static_cast<size_t>(s_.n));
  prefix_.resize(s_.prompt_lens.size());
  pending_choices_ = static_cast<int>(choices_.size());
}

std::string Generation::prefix_header() const {
  std::string out;
  for (const PrefixReport& p : prefix_) {
    if (!p.known) continue;
    std::string one = "matched=";
    one.append(std::to_string(p.matched)).append("; cause=").append(p.cause);
    if (p.position >= 0) one.append("; position=").append(std::to_string(p.position));
    if (p.evicted_ago_s >= 0) {
      char ago[32];
      std::snprintf(ago, sizeof ago, "%.3f", p.evicted_ago_s);
      one.append("; evicted_ago=").append(ago);
    }
    if (!out.empty()) out.append(", ");
    out.append(one);
  }
  return out;
}

void Generation::access_log(int status, const std::string& finish, const std::string& error) const {
  if (!s_.log_access) return;
  // prefix="matched=N; cause=C; ..." per prompt (the x-pagoda-prefix header's value).
  std::string prefix = prefix_header();
  if (!prefix.empty()) prefix = " prefix=\"" + prefix + "\"";
  int64_t pt = 0, ct = 0;
  for (int32_t len : s_.prompt_lens) pt += len;
  for (const auto& c : choices_) ct += c.num_tokens;
  const double now = now_seconds();
  char ttft[32] = "-";
  if (t_first_ > 0) std::snprintf(ttft, sizeof ttft, "%.3fs", t_first_ - s_.t_start);
  PAGODA_LOG_INFO("%s %s status=%d prompt_tokens=%lld output_tokens=%lld cached_tokens=%lld ttft=%s duration=%.3fs "
                  "finish=%s%s%s%s",
                  s_.meta.id.c_str(), s_.meta.endpoint == Endpoint::kChat ? "/v1/chat/completions" : "/v1/completions",
                  status, static_cast<long long>(pt), static_cast<long long>(ct), static_cast<long long>(cached_tokens_),
                  ttft, now - s_.t_start, finish.c_str(), prefix.c_str(), error.empty() ? "" : " error=", error.c_str());
}

void Generation::on_added(const std::string& error) {
  std::lock_guard<std::mutex> l(mu_);
  if (done_) return;
  if (!error.empty()) {
    // Nothing was sent yet, streaming or not: a plain 400.
    access_log(400, "error", error);
    done_ = true;
    metrics_.inc_counter("pagoda:request_failure_total", 1, "400");
    res_->send(400, "application/json", error_body(ApiError{400, error, "invalid_request_error", "", ""}));
    res_.reset();
    return;
  }
  if (s_.stream) res_->start_stream(200);
}

void Generation::fail(const ApiError& e) {
  access_log(s_.stream ? 200 : e.status, "error", e.message);
  done_ = true;
  if (s_.stream) {
    // The 200 header is out: the error travels as an event, then the stream ends.
    res_->write(sse(json::parse(error_body(e))));
    res_->write(sse_done());
    res_->end_stream();
  } else {
    metrics_.inc_counter("pagoda:request_failure_total", 1, std::to_string(e.status));
    res_->send(e.status, "application/json", error_body(e));
  }
  res_.reset();
}

bool Generation::on_disconnect() {
  std::lock_guard<std::mutex> l(mu_);
  const bool running = !done_;
  if (running) access_log(499, "abort", "client disconnected");  // 499: nginx's "client closed request"
  done_ = true;
  res_.reset();
  return running;
}

void Generation::on_event(size_t prompt, const engine::TokenEvent& ev) {
  std::lock_guard<std::mutex> l(mu_);
  if (done_) return;
  if (ev.finish == engine::FinishReason::kError) {
    // AsyncEngine has stopped the submission's other prompts already.
    return fail(ApiError{400, ev.error.empty() ? "request failed" : ev.error, "invalid_request_error", "", ""});
  }
  const size_t ci = prompt * static_cast<size_t>(s_.n) + static_cast<size_t>(ev.index);
  if (ci >= choices_.size()) return;
  Choice& c = choices_[ci];
  if (t_first_ == 0 && !ev.tokens.empty()) t_first_ = now_seconds();
  if (ev.index == 0 && ev.num_cached_tokens > 0 && c.num_tokens == 0) cached_tokens_ += ev.num_cached_tokens;
  if (ev.index == 0 && !ev.prefix_miss.empty() && !prefix_[prompt].known) {
    prefix_[prompt] = PrefixReport{true, ev.num_cached_tokens, ev.prefix_miss, ev.prefix_miss_position,
                                   ev.prefix_evicted_ago_s};
    if (ev.prefix_miss != "none") metrics_.inc_counter("pagoda:prefix_cache_miss_total", 1, ev.prefix_miss);
  }
  const size_t text_off0 = c.text.size();
  if (s_.stream) {
    // Streamed output is not kept: only the token count matters for usage.
    if (s_.tool_names.empty() || !stream_tool_event(ci, ev)) stream_event(prompt, ci, ev, text_off0);
  } else {
    c.text += ev.text;
    c.tokens.insert(c.tokens.end(), ev.tokens.begin(), ev.tokens.end());
    c.logprobs.insert(c.logprobs.end(), ev.logprobs.begin(), ev.logprobs.end());
  }
  c.num_tokens = ev.num_output_tokens;  // the engine's count, this event's tokens included
  c.finish = ev.finish;
  if (ev.finish == engine::FinishReason::kNone) return;
  if (--pending_choices_ > 0) return;
  finish_all();
}

void Generation::stream_event(size_t prompt, size_t ci, const engine::TokenEvent& ev, size_t text_off0) {
  Choice& c = choices_[ci];
  const Endpoint ep = s_.meta.endpoint;
  json lp = ev.logprobs.empty() ? json() : logprobs_json(ep, text_.tokenizer(), ev.logprobs, text_off0);
  const bool first = !c.first_sent;
  c.first_sent = true;
  std::string text = ev.text;
  if (ep == Endpoint::kCompletions && s_.echo && first) text = s_.echo_text[prompt] + text;
  json choice = stream_choice_json(ep, ci, text, first, std::move(lp), ev.finish);
  if (s_.return_token_ids) {
    choice["token_ids"] = ev.tokens;
    if (ep == Endpoint::kCompletions && first) choice["prompt_token_ids"] = s_.prompt_ids[prompt];
  }
  json chunk = chunk_json(s_.meta, json::array({std::move(choice)}));
  if (s_.return_token_ids && ep == Endpoint::kChat && first && ci == 0) chunk["prompt_token_ids"] = s_.prompt_ids[prompt];
  res_->write(sse(chunk));
}

json Generation::usage() const {
  int64_t pt = 0, ct = 0;
  for (int32_t len : s_.prompt_lens) pt += len;
  for (const auto& c : choices_) ct += c.num_tokens;
  return usage_json(pt, ct, cached_tokens_);
}

void Generation::finish_all() {
  done_ = true;
  const Endpoint ep = s_.meta.endpoint;
  {
    std::string finish;  // every choice's reason, "stop" or "stop,length" when they differ
    for (const auto& c : choices_) {
      const std::string r = engine::finish_reason_name(c.finish);
      if (finish.find(r) == std::string::npos) finish += (finish.empty() ? "" : ",") + r;
    }
    access_log(200, finish, "");
  }
  if (s_.stream) {
    if (s_.include_usage) {
      json j = chunk_json(s_.meta, json::array());
      j["usage"] = usage();
      res_->write(sse(j));
    }
    res_->write(sse_done());
    res_->end_stream();
    res_.reset();
    return;
  }
  json u = usage();  // before the loop below releases each choice's tokens
  json choices = json::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    Choice& ch = choices_[i];
    const size_t prompt = i / static_cast<size_t>(s_.n);
    json lp = ch.logprobs.empty() ? json() : logprobs_json(ep, text_.tokenizer(), ch.logprobs, 0);
    std::string text = ep == Endpoint::kCompletions && s_.echo ? s_.echo_text[prompt] + ch.text : ch.text;
    json choice = final_choice_json(ep, i, text, std::move(lp), ch.finish);
    if (!s_.tool_names.empty() && ep == Endpoint::kChat) {
      ToolParse tp = parse_tool_calls(ch.text, s_.tool_names);
      if (!tp.calls.empty()) {
        json calls = json::array();
        for (size_t k = 0; k < tp.calls.size(); ++k) calls.push_back(tool_call_json(tp.calls[k], call_id(i, k)));
        choice["message"]["content"] = tp.content.empty() ? json() : json(tp.content);
        choice["message"]["tool_calls"] = std::move(calls);
        choice["finish_reason"] = "tool_calls";
      }
    }
    if (s_.return_token_ids) {
      if (ep == Endpoint::kCompletions) choice["prompt_token_ids"] = s_.prompt_ids[prompt];
      choice["token_ids"] = ch.tokens;
    }
    choices.push_back(std::move(choice));
    // Each choice's accumulated output goes as soon as it is in the JSON tree.
    ch = Choice{};
  }
  json j = response_json(s_.meta, std::move(choices), std::move(u));
  if (s_.return_token_ids && ep == Endpoint::kChat) j["prompt_token_ids"] = s_.prompt_ids[0];
  std::map<std::string, std::string> headers;
  if (std::string p = prefix_header(); !p.empty()) headers["x-pagoda-prefix"] = std::move(p);
  res_->send(200, "application/json", dump_json(j), std::move(headers));
  res_.reset();
}

}  // namespace pagoda::server
