// Serving benchmark against an OpenAI-compatible server: the worker-per-slot run
// loop (the protocol's parsing is openai_stream.cc).
//
// Each worker owns one keep-alive connection and drives Beast's async operations
// on its own io_context, so every read has a deadline (tcp_stream timeouts) while
// the code reads like blocking I/O. No exception leaves a worker: every failure
// becomes a failed RequestResult.
#include "loadgen/http_client.h"

#include <algorithm>
#include <atomic>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "base/timer.h"

namespace pagoda::loadgen {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// ---- One connection ----------------------------------------------------------

namespace {

// A keep-alive HTTP/1.1 connection driven synchronously over async operations
// with deadlines. One thread at a time.
class Conn {
 public:
  Conn(const ServerUrl& url, std::string api_key) : url_(url), api_key_(std::move(api_key)) {}
  ~Conn() { close(); }

  bool connected() const { return connected_; }

  void close() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.close();
    buffer_.clear();
    connected_ = false;
  }

  beast::error_code connect(Clock::time_point deadline) {
    tcp::resolver resolver(ioc_);
    beast::error_code ec;
    auto endpoints = resolver.resolve(url_.host, url_.port, ec);
    if (ec) return ec;
    stream_.expires_at(deadline);
    ec = run([&](auto h) { stream_.async_connect(endpoints, std::move(h)); });
    connected_ = !ec;
    return ec;
  }

  http::request<http::string_body> make_request(http::verb verb, const std::string& path, std::string body) const {
    http::request<http::string_body> req{verb, url_.base_path + path, 11};
    req.set(http::field::host, url_.port == "80" ? url_.host : url_.host + ":" + url_.port);
    req.set(http::field::user_agent, "pagoda-bench");
    if (!api_key_.empty()) req.set(http::field::authorization, "Bearer " + api_key_);
    if (verb == http::verb::post) {
      req.set(http::field::content_type, "application/json");
      req.set(http::field::accept, "text/event-stream");
    }
    req.keep_alive(true);
    req.body() = std::move(body);
    req.prepare_payload();
    return req;
  }

  beast::error_code write(http::request<http::string_body>& req, Clock::time_point deadline) {
    stream_.expires_at(deadline);
    return run([&](auto h) { http::async_write(stream_, req, std::move(h)); });
  }

  template <class Parser>
  beast::error_code read_header(Parser& p, Clock::time_point deadline) {
    stream_.expires_at(deadline);
    return run([&](auto h) { http::async_read_header(stream_, buffer_, p, std::move(h)); });
  }

  // Reads what has arrived (at least one byte) into the parser: for a buffer_body the
  // decoded bytes land in its buffer, so SSE chunks are seen as they come.
  template <class Parser>
  beast::error_code read_some(Parser& p, Clock::time_point deadline) {
    stream_.expires_at(deadline);
    beast::error_code ec = run([&](auto h) { http::async_read_some(stream_, buffer_, p, std::move(h)); });
    return ec == http::error::need_buffer ? beast::error_code{} : ec;
  }

  // Sends a request, reconnecting once when a reused keep-alive connection turns
  // out to be closed, and reads the response header.
  template <class Parser>
  beast::error_code send(http::request<http::string_body>& req, Parser& p, Clock::time_point deadline,
                         std::string* stage) {
    for (int attempt = 0;; ++attempt) {
      const bool reused = connected_;
      beast::error_code ec;
      if (!connected_) {
        *stage = "connect to " + url_.host + ":" + url_.port;
        ec = connect(deadline);
        if (ec) return ec;
      }
      *stage = "send";
      ec = write(req, deadline);
      if (!ec) {
        *stage = "response header";
        ec = read_header(p, deadline);
      }
      if (!ec) return ec;
      close();
      if (!reused || attempt > 0 || ec == beast::error::timeout) return ec;
    }
  }

 private:
  // Starts one async operation and runs the io_context until it completes.
  template <class Init>
  beast::error_code run(Init&& init) {
    beast::error_code out = net::error::would_block;
    init([&out](beast::error_code ec, auto&&...) { out = ec; });
    ioc_.restart();
    ioc_.run();
    return out;
  }

  ServerUrl url_;
  std::string api_key_;
  net::io_context ioc_;
  beast::tcp_stream stream_{ioc_};
  beast::flat_buffer buffer_;
  bool connected_ = false;
};

Clock::time_point deadline_after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

std::string describe(const beast::error_code& ec, const std::string& stage, double timeout_s) {
  if (ec == beast::error::timeout) {
    char b[64];
    std::snprintf(b, sizeof(b), "%.0f", timeout_s);
    return stage + ": timed out after " + b + " s";
  }
  return stage + ": " + ec.message();
}

// GET path; the body of a 200 answer, else an error.
Expected<std::string> http_get(Conn& conn, const std::string& path, double timeout_s) {
  auto req = conn.make_request(http::verb::get, path, "");
  http::response_parser<http::string_body> p;
  p.body_limit(64u << 20);
  const auto deadline = deadline_after(timeout_s);
  std::string stage;
  beast::error_code ec = conn.send(req, p, deadline, &stage);
  while (!ec && !p.is_done()) ec = conn.read_some(p, deadline);
  if (ec) {
    conn.close();
    return make_error("GET " + path + ": " + describe(ec, stage, timeout_s));
  }
  if (!p.keep_alive()) conn.close();
  if (p.get().result_int() != 200)
    return errorf("GET %s: HTTP %u", path.c_str(), static_cast<unsigned>(p.get().result_int()));
  return p.get().body();
}

// The message of an OpenAI-style error body, else its first bytes.
std::string error_text(const std::string& body) {
  json j = json::parse(body, nullptr, false);
  if (j.is_object() && j.contains("error")) {
    const json& e = j["error"];
    if (e.is_object() && e.contains("message") && e["message"].is_string()) return e["message"].get<std::string>();
    if (e.is_string()) return e.get<std::string>();
  }
  return body.substr(0, 300);
}

// One streamed completion on conn. Never throws.
RequestResult stream_one(Conn& conn, const BenchRequest& br, const ServerRunOptions& opts) {
  RequestResult r;
  r.prompt_tokens = static_cast<int64_t>(br.prompt.size());
  auto req = conn.make_request(http::verb::post, opts.endpoint,
                               completion_body(br, opts.model_name, opts.run.ignore_eos,
                                               opts.endpoint == "/v1/chat/completions"));
  const double st = now_seconds();
  const auto deadline = deadline_after(opts.request_timeout_s);
  http::response_parser<http::buffer_body> p;
  p.body_limit(std::numeric_limits<std::uint64_t>::max());
  std::string stage;
  beast::error_code ec = conn.send(req, p, deadline, &stage);
  if (ec) {
    r.error = describe(ec, stage, opts.request_timeout_s);
    return r;
  }
  const unsigned status = p.get().result_int();
  std::string error_body;
  SseParser sse;
  bool got_first = false, stream_error = false, all_ids = true;
  double last = st;
  int64_t content_chunks = 0, completion_tokens = -1, cached = -1;
  auto on_data = [&](const std::string& data) {
    const double t = now_seconds();
    StreamChunk c = parse_stream_chunk(data);
    if (c.done) return;
    if (c.error) {
      if (!stream_error) r.error = c.error_message;
      stream_error = true;
      return;
    }
    if (c.has_choice && (!c.text.empty() || !c.token_ids.empty())) {
      if (!got_first) {
        r.ttft = t - st;
        got_first = true;
      } else {
        r.itl.push_back(t - last);
      }
      last = t;
      ++content_chunks;
      if (c.token_ids.empty()) all_ids = false;
      r.output_ids.insert(r.output_ids.end(), c.token_ids.begin(), c.token_ids.end());
    }
    r.text += c.text;
    if (c.completion_tokens >= 0) completion_tokens = c.completion_tokens;
    if (c.cached_tokens >= 0) cached = c.cached_tokens;
  };
  stage = "response body";
  while (!p.is_done()) {
    char buf[16384];
    p.get().body().data = buf;
    p.get().body().size = sizeof(buf);
    ec = conn.read_some(p, deadline);
    const size_t n = sizeof(buf) - p.get().body().size;
    if (status == 200) {
      sse.feed(std::string_view(buf, n), on_data);
    } else if (error_body.size() < (64u << 10)) {
      error_body.append(buf, n);
    }
    if (ec) break;
  }
  if (status == 200) sse.finish(on_data);
  if (ec || !p.keep_alive()) conn.close();
  if (status != 200) {
    r.error = "HTTP " + std::to_string(status) + ": " + error_text(error_body);
    return r;
  }
  if (ec) {
    r.error = describe(ec, stage, opts.request_timeout_s);
    return r;
  }
  if (stream_error) return r;
  if (content_chunks == 0) {
    r.error = "the stream ended without any generated text";
    return r;
  }
  r.ok = true;
  r.e2e = last - st;
  r.output_tokens = completion_tokens >= 0 ? completion_tokens : content_chunks;
  r.ids_known = all_ids && static_cast<int64_t>(r.output_ids.size()) == r.output_tokens;
  if (!r.ids_known) r.output_ids.clear();
  r.cached_tokens = cached;
  return r;
}

const std::vector<std::string> kKvUsageSuffixes = {":kv_cache_usage_perc", ":gpu_cache_usage_perc",
                                                   ":kv_cache_usage_ratio"};
const std::vector<std::string> kPreemptionSuffixes = {":num_preemptions_total", ":num_preemptions"};

}  // namespace

// ---- The run -----------------------------------------------------------------

std::vector<RequestResult> run_server(const ServerUrl& url, const std::vector<BenchRequest>& requests,
                                      ServerRunOptions* opts, RunExtras* extras) {
  constexpr size_t kMaxSlots = 256;
  const size_t n = requests.size();
  std::vector<RequestResult> results(n);
  *extras = RunExtras{};
  Conn admin(url, opts->api_key);
  if (opts->model_name.empty()) {
    auto models = http_get(admin, "/v1/models", 10);
    if (models.ok()) {
      opts->model_name = first_model_id(*models);
    } else {
      std::fprintf(stderr, "pagoda bench: %s (sending no \"model\")\n", models.message().c_str());
    }
  }
  // /metrics is optional (llama-server needs --metrics): scrape only if it answers.
  bool scrape = false;
  double preempt0 = -1;
  if (auto m = http_get(admin, "/metrics", 5); m.ok()) {
    preempt0 = scrape_metric(*m, kPreemptionSuffixes);
    scrape = preempt0 >= 0 || scrape_metric(*m, kKvUsageSuffixes) >= 0;
  }
  double peak_kv = -1;

  size_t slots = opts->run.max_concurrency > 0 ? static_cast<size_t>(opts->run.max_concurrency) : kMaxSlots;
  if (opts->run.max_concurrency <= 0 && n > kMaxSlots) opts->run.max_concurrency = static_cast<int>(kMaxSlots);
  slots = std::max<size_t>(1, std::min(slots, n));
  const std::vector<double> arrivals = arrival_times(static_cast<int>(n), opts->run.request_rate, opts->run.seed);

  std::atomic<size_t> next{0};
  std::mutex mu;
  std::condition_variable cv;
  size_t done = 0;
  const double t0 = now_seconds();
  double last_finish = t0;
  // Connections outlive their workers and close after the last /metrics scrape:
  // a client that hangs up right after the last byte must not race the server's
  // completion of that write.
  std::vector<std::unique_ptr<Conn>> conns;
  for (size_t s = 0; s < slots; ++s) conns.push_back(std::make_unique<Conn>(url, opts->api_key));
  auto worker = [&](Conn& conn) {
    for (;;) {
      const size_t i = next.fetch_add(1);
      if (i >= n) break;
      const double wait = t0 + arrivals[i] - now_seconds();
      if (wait > 0) std::this_thread::sleep_for(std::chrono::duration<double>(wait));
      RequestResult r;
      const double sent = now_seconds();
      try {
        r = stream_one(conn, requests[i], *opts);
      } catch (const std::exception& e) {
        r = RequestResult{};
        r.error = std::string("client error: ") + e.what();
        conn.close();
      }
      const double t = now_seconds();
      r.start = sent - t0;
      {
        std::lock_guard<std::mutex> l(mu);
        results[i] = std::move(r);
        ++done;
        last_finish = std::max(last_finish, t);
      }
      cv.notify_one();
    }
  };
  std::vector<std::thread> threads;
  for (size_t s = 0; s < slots; ++s) {
    try {
      threads.emplace_back(worker, std::ref(*conns[s]));
    } catch (const std::system_error& e) {
      if (threads.empty()) {
        for (auto& r : results) r.error = std::string("cannot start a client thread: ") + e.what();
        return results;
      }
      std::fprintf(stderr, "pagoda bench: only %zu client threads could start (%s)\n", threads.size(), e.what());
      break;
    }
  }
  {
    std::unique_lock<std::mutex> l(mu);
    double last_scrape = 0;
    while (done < n) {
      cv.wait_for(l, std::chrono::milliseconds(100));
      if (opts->run.progress) opts->run.progress(done, n);
      if (!scrape || done >= n || now_seconds() - last_scrape < 0.1) continue;
      last_scrape = now_seconds();
      l.unlock();
      if (auto m = http_get(admin, "/metrics", 2); m.ok()) {
        peak_kv = std::max(peak_kv, scrape_metric(*m, kKvUsageSuffixes));
        if (opts->run.on_scrape) opts->run.on_scrape(*m);
      }
      l.lock();
    }
  }
  for (auto& t : threads) t.join();
  extras->duration = last_finish - t0;
  if (scrape) {
    if (auto m = http_get(admin, "/metrics", 5); m.ok()) {
      peak_kv = std::max(peak_kv, scrape_metric(*m, kKvUsageSuffixes));
      if (opts->run.on_scrape) opts->run.on_scrape(*m);
      const double p1 = scrape_metric(*m, kPreemptionSuffixes);
      if (preempt0 >= 0 && p1 >= 0) extras->num_preemptions = static_cast<int64_t>(p1 - preempt0);
    }
    extras->peak_kv_usage = peak_kv;
  }
  return results;
}

}  // namespace pagoda::loadgen
