#include "server/dashboard.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "base/timer.h"
#include "server/async_engine.h"
#include "openai/openai_api.h"
#include "openai/text.h"

namespace pagoda::server {

// Snapshots taken in one inspection on the engine thread, one per viewer asked
// for, with the response ids of their requests.
struct DashboardHub::Taken {
  struct View {
    std::string key;  // DashboardViewer::key()
    engine::DashboardSnapshot snap;
    std::vector<std::string> tags;
  };
  uint64_t serial = 0;
  std::vector<View> views;
  double t = 0;
  double engine_us = 0;  // engine-thread time the snapshots took (the dashboard's cost to serving)
};

namespace {
// One snapshot for `opts` with the response id of each listed request.
void take_view(const EngineView& v, const engine::SnapshotOptions& opts, engine::DashboardSnapshot* snap,
               std::vector<std::string>* tags) {
  v.engine.snapshot(snap, opts);
  tags->reserve(snap->requests.size());
  for (const auto& r : snap->requests) tags->push_back(v.tag_of(r.id));
}
}  // namespace

DashboardHub::DashboardHub(AsyncEngine* engine, const TextCodec* text, DashboardConfig cfg)
    : engine_(engine), text_(text), cfg_(std::move(cfg)), t0_(now_seconds()) {
  thread_ = std::thread([this] { loop(); });
}

DashboardHub::~DashboardHub() { stop(); }

double DashboardHub::now() const { return now_seconds() - t0_; }

int DashboardHub::num_subscribers() const {
  std::lock_guard<std::mutex> l(mu_);
  return static_cast<int>(subs_.size());
}

void DashboardHub::stop() {
  std::vector<Subscriber> subs;
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
    subs.swap(subs_);
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (auto& s : subs) s.res->end_stream();
}

std::shared_ptr<DashboardHub::Taken> DashboardHub::take(const std::vector<DashboardViewer>& viewers,
                                                         double timeout_s) {
  uint64_t serial = 0;
  bool ask = false;
  {
    std::lock_guard<std::mutex> l(mu_);
    // One inspection in flight at most: during a long step the next tick waits
    // for the one already asked rather than queueing more.
    ask = asked_ == (taken_ ? taken_->serial : 0);
    if (ask) ++asked_;
    serial = asked_;
  }
  if (ask) {
    const engine::SnapshotOptions base = cfg_.snapshot;
    engine_->inspect([this, serial, base, viewers](const EngineView& v) {
      auto tk = std::make_shared<Taken>();
      tk->serial = serial;
      tk->t = now();
      const double t0 = now_seconds();
      tk->views.resize(viewers.size());
      for (size_t i = 0; i < viewers.size(); ++i) {
        tk->views[i].key = viewers[i].key();
        take_view(v, viewers[i].options(base), &tk->views[i].snap, &tk->views[i].tags);
      }
      tk->engine_us = (now_seconds() - t0) * 1e6;
      {
        std::lock_guard<std::mutex> l(mu_);
        taken_ = std::move(tk);
      }
      cv_.notify_all();
    });
  }
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait_for(l, std::chrono::duration<double>(timeout_s),
               [&] { return stop_ || (taken_ && taken_->serial == serial); });
  if (stop_ || !taken_ || taken_->serial != serial) return nullptr;
  return taken_;
}

std::vector<SeriesPoint> DashboardHub::series_from(size_t from, size_t* next) const {
  std::vector<SeriesPoint> out;
  const size_t begin = std::max(from, series_dropped_);
  for (size_t i = begin; i < series_dropped_ + series_.size(); ++i) out.push_back(series_[i - series_dropped_]);
  *next = series_dropped_ + series_.size();
  return out;
}

void DashboardHub::loop() {
  double next_sample = 0;
  double last_encode_us = 0;
  for (;;) {
    double wake = next_sample;
    {
      std::unique_lock<std::mutex> l(mu_);
      for (const auto& s : subs_) wake = std::min(wake, s.next_due);
      const double wait = std::max(0.0, wake - now());
      cv_.wait_for(l, std::chrono::duration<double>(wait), [&] { return stop_; });
      if (stop_) return;
      // Drop subscribers that went away.
      subs_.erase(std::remove_if(subs_.begin(), subs_.end(), [](const Subscriber& s) { return s.gone->load(); }),
                  subs_.end());
    }
    const double t = now();
    if (t >= next_sample) {
      const SeriesPoint p = series_point(t, engine_->stats());
      std::lock_guard<std::mutex> l(mu_);
      series_.push_back(p);
      while (series_.size() > cfg_.series_capacity) {
        series_.pop_front();
        ++series_dropped_;
      }
      next_sample = t + cfg_.series_period_s;
    }
    // The distinct viewers of the due subscribers: one snapshot each.
    std::vector<DashboardViewer> viewers;
    {
      std::lock_guard<std::mutex> l(mu_);
      for (const auto& s : subs_) {
        if (s.next_due > t) continue;
        bool seen = false;
        for (const auto& v : viewers) seen = seen || v.key() == s.viewer.key();
        if (!seen) viewers.push_back(s.viewer);
      }
    }
    if (viewers.empty()) continue;
    std::shared_ptr<Taken> tk = take(viewers, 1.0);
    if (!tk) continue;  // the engine is stopping (or stuck in a long step): try at the next tick
    // Each view's JSON without its closing brace; each subscriber gets its own series tail.
    const double enc0 = now_seconds();
    std::vector<std::string> bodies;
    for (const auto& view : tk->views) {
      std::string body = snapshot_json(view.snap, view.tags, tk->t);
      body.pop_back();
      // The two costs of watching: engine-thread time (these snapshots) and this
      // thread's time encoding and queueing the previous event.
      body += ",\"snapshot_us\":" + std::to_string(static_cast<int64_t>(tk->engine_us)) +
              ",\"encode_us\":" + std::to_string(static_cast<int64_t>(last_encode_us));
      bodies.push_back(std::move(body));
    }
    std::vector<std::pair<std::shared_ptr<Responder>, std::string>> out;
    {
      std::lock_guard<std::mutex> l(mu_);
      const double after = now();
      for (auto& s : subs_) {
        if (s.next_due > t) continue;
        // A snapshot asked for before this subscriber's viewer was due may lack it:
        // it stays due, and the next take asks for it.
        size_t k = 0;
        while (k < tk->views.size() && tk->views[k].key != s.viewer.key()) ++k;
        if (k == tk->views.size()) continue;
        const std::string& body = bodies[k];
        size_t next = 0;
        const std::vector<SeriesPoint> pts = series_from(s.series_sent, &next);
        s.series_sent = next;
        // Keep the phase: a late tick does not make later ones late too.
        s.next_due = std::max(s.next_due + s.period, after);
        out.emplace_back(s.res, "event: snapshot\ndata: " + body + ",\"series\":" + series_json(pts) + "}\n\n");
      }
    }
    for (auto& [res, text] : out) res->write(std::move(text));
    last_encode_us = (now_seconds() - enc0) * 1e6;
  }
}

void DashboardHub::handle(const HttpRequest& req, std::shared_ptr<Responder> res, const DashboardViewer& viewer) {
  const bool head = req.method == "HEAD";
  if (req.target == "/dashboard") {
    return res->send(200, "text/html; charset=utf-8", head ? std::string() : dashboard_page(),
                     {{"Cache-Control", "no-store"}});
  }
  if (head) return res->send(200, "application/json", "");  // the JSON and SSE routes: headers only
  if (req.target == "/dashboard/events") {
    int hz = cfg_.default_hz;
    const std::string v = query_param(req.query, "hz");
    if (!v.empty()) {
      char* end = nullptr;
      const long h = std::strtol(v.c_str(), &end, 10);
      if (*end != '\0' || h < 1 || h > cfg_.max_hz) {
        ApiError e{400, "hz must be an integer in 1.." + std::to_string(cfg_.max_hz) + ", got '" + v + "'",
                   "invalid_request_error", "hz", "invalid_value"};
        return res->send(400, "application/json", error_body(e));
      }
      hz = static_cast<int>(h);
    }
    res->start_stream(200);
    Subscriber s;
    s.res = res;
    s.period = 1.0 / hz;
    s.gone = std::make_shared<std::atomic<bool>>(false);
    s.viewer = viewer;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (stop_) return res->end_stream();
      s.next_due = now();  // the first event at once, with the whole kept series
      subs_.push_back(s);
    }
    std::weak_ptr<std::atomic<bool>> gone = s.gone;
    res->on_disconnect([gone] {
      if (auto g = gone.lock()) *g = true;
    });
    cv_.notify_all();
    return;
  }
  if (req.target == "/dashboard/snapshot") {
    // Taken and encoded on the engine thread: a one-off look (tests, curl),
    // not the periodic stream, so the I/O thread never waits for a step.
    const engine::SnapshotOptions opts = viewer.options(cfg_.snapshot);
    engine_->inspect([this, res, opts](const EngineView& v) {
      engine::DashboardSnapshot snap;
      std::vector<std::string> tags;
      take_view(v, opts, &snap, &tags);
      std::string body = snapshot_json(snap, tags, now());
      body.pop_back();
      size_t next = 0;
      std::vector<SeriesPoint> pts;
      {
        std::lock_guard<std::mutex> l(mu_);
        pts = series_from(0, &next);
      }
      res->send(200, "application/json", body + ",\"series\":" + series_json(pts) + "}");
    });
    return;
  }
  if (req.target == "/dashboard/kv_blocks") {
    // The engine's own view of the blocks it holds, per KV group and medium
    // (issue 37: what a KV event subscriber's replayed view must equal); a
    // tenant sees only its own blocks.
    const engine::SnapshotOptions opts = viewer.options(cfg_.snapshot);
    engine_->inspect([res, opts](const EngineView& view) {
      json blocks = json::array();
      for (const engine::KvBlockKey& k : view.engine.kv_block_keys(opts)) blocks.push_back({k.group, k.medium, k.hash});
      res->send(200, "application/json", dump_json(json{{"blocks", std::move(blocks)}}));
    });
    return;
  }
  if (req.target == "/dashboard/block") {
    const std::string v = query_param(req.query, "id");
    char* end = nullptr;
    const long b = v.empty() ? -1 : std::strtol(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || b < 1 || b > INT32_MAX) {
      ApiError e{400, "id must be a block id >= 1, got '" + v + "'", "invalid_request_error", "id", "invalid_value"};
      return res->send(400, "application/json", error_body(e));
    }
    const TextCodec* text = text_;
    const engine::SnapshotOptions opts = viewer.options(cfg_.snapshot);
    engine_->inspect([res, text, b, opts](const EngineView& view) {
      std::vector<int32_t> ids = view.engine.cached_block_tokens(static_cast<int32_t>(b));
      // Another tenant's block reads as not cached: the answer says nothing of it.
      if (!ids.empty() && !engine::salt_visible(opts, view.engine.cached_block_salt(static_cast<int32_t>(b))))
        ids.clear();
      if (ids.empty()) {
        ApiError e{404, "block " + std::to_string(b) + " holds no cached prefix", "NotFoundError", "id", "not_found"};
        return res->send(404, "application/json", error_body(e));
      }
      // A block's text is a handful of tokens: decoding here costs microseconds.
      // pinned_ttl_s: seconds left of the pin holding it longest (0: not pinned; issue 36).
      json j = {{"block", b}, {"tokens", ids}, {"text", text->decode(ids)},
                {"pinned_ttl_s", view.engine.pin_ttl_left(static_cast<int32_t>(b))}};
      res->send(200, "application/json", dump_json(j));
    });
    return;
  }
  ApiError e{404, "no route for " + req.method + " " + req.target, "NotFoundError", "", "not_found"};
  res->send(404, "application/json", error_body(e));
}

}  // namespace pagoda::server
