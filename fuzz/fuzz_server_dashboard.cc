// libFuzzer target for the dashboard routes of server/ (issue 35) and the HTTP head
// checks. One stories260K engine (two tenants' prompts cached, under the salts
// "tagA/..." and "tagB/...") behind an AsyncEngine and a DashboardHub; each input is
// one request: its first byte picks the route (/dashboard/snapshot, /block, /events)
// and the viewer (all, tenant A, tenant B), the rest is the raw query string
// (?id=, ?hz=, ?key=, percent escapes). The same bytes go to scan_request_head and
// check_transfer_encoding. Checks: no crash; every answer is 200, 400 or 404 with a
// JSON body; a tenant is never answered a block or a prefix-tree node under another
// tenant's salt, and never sees a request.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "fuzz_check.h"
#include "server/async_engine.h"
#include "server/dashboard.h"
#include "http/http.h"
#include "server/metrics.h"
#include "openai/openai_api.h"
#include "openai/text.h"

using namespace pagoda;
using namespace pagoda::server;

namespace {

void check(bool ok, const char* what) { pagoda::fuzz::check(ok, "fuzz_server_dashboard", what); }

// Records the one answer of a request.
class Recorder : public Responder {
 public:
  void send(int status, const std::string&, std::string body, std::map<std::string, std::string>) override {
    std::lock_guard<std::mutex> l(mu_);
    status_ = status;
    body_ = std::move(body);
    cv_.notify_all();
  }
  void start_stream(int status) override { send(status, "", "", {}); }
  void write(std::string) override {}
  void end_stream() override {}
  void on_disconnect(std::function<void()> fn) override {
    std::lock_guard<std::mutex> l(mu_);
    disconnect_ = std::move(fn);
  }
  // The status (0 when nothing came within 10 s) and body.
  int wait(std::string* body) {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait_for(l, std::chrono::seconds(10), [&] { return status_ != 0; });
    *body = body_;
    return status_;
  }
  void disconnect() {
    std::function<void()> fn;
    {
      std::lock_guard<std::mutex> l(mu_);
      fn = std::move(disconnect_);
    }
    if (fn) fn();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int status_ = 0;
  std::string body_;
  std::function<void()> disconnect_;
};

struct Setup {
  Metrics metrics;
  std::unique_ptr<TextCodec> text;
  std::unique_ptr<AsyncEngine> engine;
  std::unique_ptr<DashboardHub> hub;
  std::vector<std::string> salt_of;  // [block] the cache salt of each cached block ("" when none)
};

Setup* make_setup() {
  engine::EngineConfig c;
  c.model_path = std::string(PAGODA_TEST_DATA) + "/stories260K.gguf";
  c.threads = 1;
  c.block_size = 16;
  c.num_kv_blocks = 24;
  auto e = engine::Engine::create(c);
  check(e.ok(), "stories260K did not load");
  std::unique_ptr<engine::Engine> eng = std::move(e).value();
  for (int i = 0; i < 4; ++i) {
    engine::RequestParams p;
    for (int t = 0; t < 40; ++t) p.prompt.push_back(10 + t + 50 * i);
    p.max_tokens = 2;
    p.temperature = 0;
    p.cache_salt = i % 2 ? "tagB/" : "tagA/x";
    check(eng->add_request(p).ok(), "add_request");
  }
  while (eng->has_unfinished()) eng->step();
  auto* s = new Setup;
  for (int32_t b = 0; b < c.num_kv_blocks; ++b) s->salt_of.push_back(eng->cached_block_salt(b));
  auto text = TextCodec::create(eng->tokenizer(), "");
  check(text.ok(), "text codec");
  s->text = std::move(text).value();
  s->engine = std::make_unique<AsyncEngine>(std::move(eng), &s->metrics);
  s->hub = std::make_unique<DashboardHub>(s->engine.get(), s->text.get());
  return s;
}

bool visible(const DashboardViewer& v, const std::string& salt) {
  return v.all || salt.compare(0, v.salt_prefix.size(), v.salt_prefix) == 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Setup* s = make_setup();
  if (size == 0) return 0;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);

  // The HTTP head checks on the same bytes.
  const HeadScan scan = scan_request_head(rest);
  check(scan == HeadScan::kIncomplete || scan == HeadScan::kComplete || scan == HeadScan::kObsFold, "head scan");
  std::string coding = rest;  // accepted exactly when it is "chunked", any case, blanks around
  while (!coding.empty() && (coding.back() == ' ' || coding.back() == '\t')) coding.pop_back();
  coding.erase(0, std::min(coding.size(), coding.find_first_not_of(" \t")));
  for (char& ch : coding) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  check(check_transfer_encoding({rest}).empty() == (coding == "chunked"), "Transfer-Encoding check");

  static const char* const kRoutes[] = {"/dashboard/snapshot", "/dashboard/block", "/dashboard/events"};
  const uint8_t sel = data[0];
  HttpRequest req;
  req.method = "GET";
  req.target = kRoutes[sel % 3];
  req.query = rest;
  DashboardViewer viewer;
  if ((sel / 3) % 3 != 0) {
    viewer.all = false;
    viewer.salt_prefix = (sel / 3) % 3 == 1 ? "tagA/" : "tagB/";
  }
  auto rec = std::make_shared<Recorder>();
  s->hub->handle(req, rec, viewer);
  std::string body;
  const int status = rec->wait(&body);
  check(status == 200 || status == 400 || status == 404, "status");
  if (req.target == "/dashboard/events") {
    rec->disconnect();  // the hub drops the subscriber at its next tick
    return 0;
  }
  const json j = json::parse(body, nullptr, false);
  check(!j.is_discarded(), "answer is not JSON");
  if (status != 200) {
    check(j.contains("error"), "error shape");
    return 0;
  }
  if (req.target == "/dashboard/block") {
    const int64_t b = j.at("block").get<int64_t>();
    check(b > 0 && b < static_cast<int64_t>(s->salt_of.size()), "block id");
    check(visible(viewer, s->salt_of[static_cast<size_t>(b)]), "a block of another tenant was answered");
  } else {
    check(j.at("requests").empty(), "a request is listed (all have finished)");
    for (const auto& n : j.at("prefix").at("nodes")) {
      const int64_t b = n.at(0).get<int64_t>();
      check(visible(viewer, s->salt_of.at(static_cast<size_t>(b))), "a prefix node of another tenant");
    }
  }
  return 0;
}
