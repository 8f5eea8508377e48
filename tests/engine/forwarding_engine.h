// An Engine that forwards to a real one, with two faults a test can switch on:
// drop the next request accepted (its step() aborts it and hides its events, so
// the engine goes idle without finishing it), or turn one event of a choice into
// a kError (the engine itself keeps running the request). For the driver's "never
// left hanging" rules (engine/driver.h, server/async_engine.h).
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"

namespace pagoda::engine {

class ForwardingEngine : public Engine {
 public:
  explicit ForwardingEngine(std::unique_ptr<Engine> e) : e_(std::move(e)) {}
  bool drop_next = false;  // drop the next request accepted
  RequestId drop = 0;      // the dropped one
  // The next event of choice fail_index of request fail_id becomes a kError.
  RequestId fail_id = 0;
  int fail_index = 0;

  Expected<RequestId> add_request(const RequestParams& p) override {
    auto id = e_->add_request(p);
    if (id.ok() && drop_next) drop = *id, drop_next = false;
    return id;
  }
  void abort(RequestId id) override { e_->abort(id); }
  std::vector<TokenEvent> step() override {
    if (drop != 0) e_->abort(drop);
    std::vector<TokenEvent> ev = e_->step();
    std::erase_if(ev, [&](const TokenEvent& x) { return drop != 0 && x.id == drop; });
    for (TokenEvent& x : ev) {
      if (fail_id == 0 || x.id != fail_id || x.index != fail_index) continue;
      x.finish = FinishReason::kError;
      x.error = "injected failure";
      fail_id = 0;
    }
    return ev;
  }
  bool has_unfinished() const override { return e_->has_unfinished(); }
  const std::vector<RequestId>& newly_scheduled() const override { return e_->newly_scheduled(); }
  EngineStats stats() const override { return e_->stats(); }
  const ModelInfo& model_info() const override { return e_->model_info(); }
  const tok::Tokenizer& tokenizer() const override { return e_->tokenizer(); }
  void snapshot(DashboardSnapshot* out, const SnapshotOptions& o) const override { e_->snapshot(out, o); }
  std::vector<int32_t> cached_block_tokens(int32_t b) const override { return e_->cached_block_tokens(b); }
  std::string cached_block_salt(int32_t b) const override { return e_->cached_block_salt(b); }
  Status reset_prefix_cache(bool force, bool tiers, std::vector<std::pair<std::string, int64_t>>* cleared) override {
    return e_->reset_prefix_cache(force, tiers, cleared);
  }
  double pin_ttl_left(int32_t b) const override { return e_->pin_ttl_left(b); }

 private:
  std::unique_ptr<Engine> e_;
};

}  // namespace pagoda::engine
