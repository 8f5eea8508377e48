#include "server/generation.h"

#include "server/metrics.h"
#include "server/text.h"
#include "tok/tokenizer.h"

namespace pagoda::server {

Generation::Generation(GenerationSetup setup, const TextCodec& text, Metrics& metrics, std::shared_ptr<Responder> res)
    : s_(std::move(setup)), text_(text), metrics_(metrics), res_(std::move(res)) {
  choices_.resize(s_.prompt_lens.size() * static_cast<size_t>(s_.n));
  pending_choices_ = static_cast<int>(choices_.size());
}

void Generation::on_added(const std::string& error) {
  std::lock_guard<std::mutex> l(mu_);
  if (done_) return;
  if (!error.empty()) {
    // Nothing was sent yet, streaming or not: a plain 400.
    done_ = true;
    metrics_.inc_counter("pagoda:request_failure_total", 1, "400");
    res_->send(400, "application/json", error_body(ApiError{400, error, "invalid_request_error", "", ""}));
    res_.reset();
    return;
  }
  if (s_.stream) res_->start_stream(200);
}

void Generation::fail(const ApiError& e) {
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
  if (ev.index == 0 && ev.num_cached_tokens > 0 && c.num_tokens == 0) cached_tokens_ += ev.num_cached_tokens;
  const size_t text_off0 = c.text.size();
  if (s_.stream) {
    stream_event(prompt, ci, ev, text_off0);
    // Streamed output is not kept: only the token count matters for usage.
    c.num_tokens += static_cast<int64_t>(ev.tokens.size());
  } else {
    c.text += ev.text;
    c.tokens.insert(c.tokens.end(), ev.tokens.begin(), ev.tokens.end());
    c.num_tokens = static_cast<int64_t>(c.tokens.size());
    c.logprobs.insert(c.logprobs.end(), ev.logprobs.begin(), ev.logprobs.end());
  }
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
  res_->send(200, "application/json", dump_json(j));
  res_.reset();
}

}  // namespace pagoda::server
