// The live KV cache dashboard of `pagoda serve` (issue 20):
//   GET /dashboard            the page (HTML + JS + CSS compiled into the binary)
//   GET /dashboard/events     SSE: one `snapshot` event per tick, ?hz=1..10 (default 4)
//   GET /dashboard/snapshot   one snapshot as JSON (same shape as an event)
//   GET /dashboard/block?id=N the token ids and text of cached block N (the tree's hover)
// Behind --api-key like every route but /health; a browser passes the key as
// ?key=KEY (EventSource cannot set headers), which the server treats as a
// bearer key on /dashboard routes only.
//
// One hub thread per server: it samples the engine's counters for the time
// series (every series_period_s, whether or not anyone watches) and, when a
// subscriber is due, asks the engine thread for one snapshot
// (AsyncEngine::inspect: a copy of integers between two steps) and encodes it
// here, off the engine thread, once for all due subscribers.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "http/http.h"

namespace pagoda::server {

class AsyncEngine;
class TextCodec;

struct DashboardConfig {
  int default_hz = 4;
  int max_hz = 10;
  double series_period_s = 0.25;  // time-series sampling period
  size_t series_capacity = 2400;  // points kept (10 minutes at 4 Hz)
  engine::SnapshotOptions snapshot;
};

// One time-series sample: raw counters, the page derives rates (so bench and
// sim reports, which record the same columns, plot with the same code).
struct SeriesPoint {
  double t = 0;  // seconds since the hub started
  int64_t blocks_used = 0, blocks_total = 0, blocks_cached = 0;
  int64_t running = 0, waiting = 0;
  int64_t prefix_queries = 0, prefix_hits = 0;  // tokens, cumulative
  int64_t preemptions = 0;                      // cumulative
  int64_t generation_tokens = 0, prompt_tokens = 0;  // cumulative
};
SeriesPoint series_point(double t, const engine::EngineStats& s);
// The points as a JSON array of arrays in SeriesPoint's field order (the
// page's SERIES_COLUMNS).
std::string series_json(const std::vector<SeriesPoint>& points);

// Grid cell codes, one byte per block (the page's colour table).
enum GridCode : uint8_t {
  kGridFree = 0,
  kGridCached = 1,
  kGridTier = 2,  // lower tier (issue 16): not set yet, see engine::BlockState::kTier
  kGridNull = 3,
  kGridShared = 4,       // held by several requests
  kGridUsedUnknown = 5,  // held, by no listed request (a waiting request beyond the list cap), or another tenant's
  kGridRequest0 = 6,     // held by requests[k]: 6 + k % 250
};
// The grid bytes of a snapshot (one per block, null block included).
std::vector<uint8_t> grid_codes(const engine::DashboardSnapshot& s);
std::string base64_encode(const uint8_t* data, size_t n);

// A snapshot as the JSON object the page reads (without "series"; the hub adds
// it per subscriber). tags[i]: requests[i]'s response id ("" when unknown).
std::string snapshot_json(const engine::DashboardSnapshot& s, const std::vector<std::string>& tags, double t);

// The value of `name` in a raw query string ("a=1&key=x%20y"), percent- and
// '+'-decoded; "" when absent.
std::string query_param(const std::string& query, const std::string& name);
// The API key a /dashboard request carries in its query (?key=), "" when none.
inline std::string dashboard_query_key(const std::string& query) { return query_param(query, "key"); }

// The page, with its CSS and JS inlined.
const std::string& dashboard_page();
// The bench / sim report: the same plotting code over recorded points, one
// self-contained HTML file. summary: a JSON object shown as a table.
std::string report_html(const std::string& title, const std::vector<SeriesPoint>& points,
                        const std::string& summary_json);

// Whose picture a dashboard request gets: everything (no tenants, or the admin
// key), or one tenant's (per-key cache salts): its own requests, blocks, prefix
// tree and block text only (engine::SnapshotOptions::only_tenant).
struct DashboardViewer {
  bool all = true;
  std::string salt_prefix;  // when !all: the tenant's cache salts start with this
  std::string key() const { return all ? "*" : "t:" + salt_prefix; }
  engine::SnapshotOptions options(engine::SnapshotOptions base) const {
    base.only_tenant = !all;
    base.tenant_salt_prefix = all ? std::string() : salt_prefix;
    return base;
  }
};

class DashboardHub {
 public:
  DashboardHub(AsyncEngine* engine, const TextCodec* text, DashboardConfig cfg = {});
  ~DashboardHub();
  DashboardHub(const DashboardHub&) = delete;
  DashboardHub& operator=(const DashboardHub&) = delete;

  // Answers a GET on a /dashboard route (after authorization) with `viewer`'s picture.
  void handle(const HttpRequest& req, std::shared_ptr<Responder> res, const DashboardViewer& viewer = {});
  // Ends every event stream and joins the thread; call before the engine stops.
  void stop();
  int num_subscribers() const;

 private:
  struct Subscriber {
    std::shared_ptr<Responder> res;
    double period = 0.25;
    double next_due = 0;
    size_t series_sent = 0;  // absolute index of the next series point it has not seen
    // Set by the responder's on_disconnect, which holds only a weak_ptr to it
    // (never the hub): a late callback touches nothing that is gone.
    std::shared_ptr<std::atomic<bool>> gone;
    DashboardViewer viewer;
  };
  void loop();
  // Asks the engine thread for one snapshot per viewer (in one inspection); waits up
  // to timeout_s. nullptr on timeout or stop.
  struct Taken;
  std::shared_ptr<Taken> take(const std::vector<DashboardViewer>& viewers, double timeout_s);
  // Series points from absolute index `from` (clamped to what is kept).
  std::vector<SeriesPoint> series_from(size_t from, size_t* next) const;
  double now() const;

  AsyncEngine* engine_;
  const TextCodec* text_;
  DashboardConfig cfg_;
  double t0_ = 0;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::vector<Subscriber> subs_;
  std::deque<SeriesPoint> series_;
  size_t series_dropped_ = 0;  // points dropped from the front (absolute index of series_[0])
  std::shared_ptr<Taken> taken_;
  uint64_t asked_ = 0;  // snapshots asked for (matches Taken::serial)
  std::thread thread_;
};

}  // namespace pagoda::server
