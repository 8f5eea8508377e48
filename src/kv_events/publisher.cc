#include "kv_events/publisher.h"

#include <zmq.h>

#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>

#include "base/log.h"

namespace pagoda::kv_events {

Expected<KvEventsConfig> KvEventsConfig::parse(const std::string& json_text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json_text);
  } catch (const std::exception& e) {
    return errorf("--kv-events-config: not valid JSON: %s", e.what());
  }
  if (!j.is_object()) return errorf("--kv-events-config: expected a JSON object");
  KvEventsConfig c;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    const nlohmann::json& v = it.value();
    auto str = [&](std::string* out) -> Status {
      if (!v.is_string()) return errorf("--kv-events-config: \"%s\" must be a string", k.c_str());
      *out = v.get<std::string>();
      return Status::Ok();
    };
    auto num = [&](int64_t* out, int64_t min) -> Status {
      if (!v.is_number_integer() || v.get<int64_t>() < min)
        return errorf("--kv-events-config: \"%s\" must be an integer >= %lld", k.c_str(), static_cast<long long>(min));
      *out = v.get<int64_t>();
      return Status::Ok();
    };
    if (k == "enable_kv_cache_events") {
      if (!v.is_boolean()) return errorf("--kv-events-config: \"%s\" must be true or false", k.c_str());
      c.enable_kv_cache_events = v.get<bool>();
    } else if (k == "publisher") {
      PAGODA_TRY(str(&c.publisher));
      if (c.publisher != "zmq" && c.publisher != "null")
        return errorf("--kv-events-config: unknown publisher \"%s\" (zmq or null)", c.publisher.c_str());
    } else if (k == "endpoint") {
      PAGODA_TRY(str(&c.endpoint));
    } else if (k == "replay_endpoint") {
      if (!v.is_null()) PAGODA_TRY(str(&c.replay_endpoint));
    } else if (k == "topic") {
      PAGODA_TRY(str(&c.topic));
    } else if (k == "buffer_steps") {
      PAGODA_TRY(num(&c.buffer_steps, 1));
    } else if (k == "hwm") {
      PAGODA_TRY(num(&c.hwm, 0));
    } else if (k == "max_queue_size") {
      PAGODA_TRY(num(&c.max_queue_size, 1));
    } else {
      return errorf("--kv-events-config: unknown key \"%s\"", k.c_str());
    }
  }
  if (c.enabled() && c.endpoint.empty()) return errorf("--kv-events-config: \"endpoint\" is empty");
  return c;
}

namespace {

bool should_bind(const std::string& ep) {
  return ep.find('*') != std::string::npos || ep.find("::") != std::string::npos || ep.rfind("ipc://", 0) == 0 ||
         ep.rfind("inproc://", 0) == 0;
}

void put_be64(uint64_t v, char out[8]) {
  for (int i = 7; i >= 0; --i) {
    out[i] = static_cast<char>(v & 0xff);
    v >>= 8;
  }
}

uint64_t get_be64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = v << 8 | static_cast<uint8_t>(p[i]);
  return v;
}

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

Expected<std::unique_ptr<Publisher>> Publisher::start(const KvEventsConfig& config) {
  std::unique_ptr<Publisher> p(new Publisher(config));
  PAGODA_TRY(p->open());
  p->thread_ = std::thread([q = p.get()] { q->run(); });
  return p;
}

Status Publisher::open() {
  ctx_ = zmq_ctx_new();
  if (!ctx_) return errorf("kv events: zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
  auto make = [&](int type, const std::string& ep, void** out) -> Status {
    void* s = zmq_socket(ctx_, type);
    if (!s) return errorf("kv events: zmq_socket: %s", zmq_strerror(zmq_errno()));
    *out = s;
    const int linger = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof(linger));
    if (type == ZMQ_PUB) {
      const int hwm = static_cast<int>(std::min<int64_t>(cfg_.hwm, INT32_MAX));
      zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof(hwm));
    }
    const int rc = should_bind(ep) ? zmq_bind(s, ep.c_str()) : zmq_connect(s, ep.c_str());
    if (rc != 0)
      return errorf("kv events: cannot %s %s: %s", should_bind(ep) ? "bind" : "connect to", ep.c_str(),
                    zmq_strerror(zmq_errno()));
    return Status::Ok();
  };
  PAGODA_TRY(make(ZMQ_PUB, cfg_.endpoint, &pub_));
  if (!cfg_.replay_endpoint.empty()) PAGODA_TRY(make(ZMQ_ROUTER, cfg_.replay_endpoint, &replay_));
  return Status::Ok();
}

Publisher::~Publisher() {
  if (thread_.joinable()) {
    flush();
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    thread_.join();
  }
  if (pub_) zmq_close(pub_);
  if (replay_) zmq_close(replay_);
  if (ctx_) zmq_ctx_term(ctx_);
}

void Publisher::publish(std::vector<KvEvent> events) {
  if (events.empty()) return;
  std::lock_guard<std::mutex> l(mu_);
  if (static_cast<int64_t>(queue_.size()) >= cfg_.max_queue_size) {
    batches_dropped_.fetch_add(1, std::memory_order_relaxed);
    events_dropped_.fetch_add(static_cast<int64_t>(events.size()), std::memory_order_relaxed);
    return;
  }
  // Counted here, not when the thread sends: a step's stats (and /metrics, published after the
  // step) then cover every message that step will put on the socket, so a subscriber never holds
  // more messages than the counter says. Sequence numbers follow this same order (FIFO queue).
  batches_published_.fetch_add(1, std::memory_order_relaxed);
  events_published_.fetch_add(static_cast<int64_t>(events.size()), std::memory_order_relaxed);
  queue_.push_back(std::move(events));
  work_cv_.notify_one();
}

void Publisher::flush() {
  std::unique_lock<std::mutex> l(mu_);
  idle_cv_.wait(l, [&] { return queue_.empty() && !busy_; });
}

PublisherStats Publisher::stats() const {
  PublisherStats s;
  s.batches_published = batches_published_.load(std::memory_order_relaxed);
  s.events_published = events_published_.load(std::memory_order_relaxed);
  s.batches_dropped = batches_dropped_.load(std::memory_order_relaxed);
  s.events_dropped = events_dropped_.load(std::memory_order_relaxed);
  s.replay_requests = replay_requests_.load(std::memory_order_relaxed);
  return s;
}

void Publisher::send_batch(std::vector<KvEvent>& events) {
  const uint64_t seq = next_seq_++;
  std::string payload = encode_payload(unix_now(), events);
  char seq_be[8];
  put_be64(seq, seq_be);
  // PUB never blocks: past the high-water mark ZeroMQ drops the message for that subscriber.
  zmq_send(pub_, cfg_.topic.data(), cfg_.topic.size(), ZMQ_SNDMORE | ZMQ_DONTWAIT);
  zmq_send(pub_, seq_be, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT);
  zmq_send(pub_, payload.data(), payload.size(), ZMQ_DONTWAIT);
  if (replay_) {
    buffer_.emplace_back(seq, std::move(payload));
    while (static_cast<int64_t>(buffer_.size()) > cfg_.buffer_steps) buffer_.pop_front();
  }
}

void Publisher::serve_replay() {
  for (;;) {
    // [identity, b"", start_seq]
    std::vector<std::string> parts;
    int more = 1;
    while (more) {
      zmq_msg_t m;
      zmq_msg_init(&m);
      if (zmq_msg_recv(&m, replay_, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&m);
        if (parts.empty()) return;  // nothing (more) waiting
        break;
      }
      parts.emplace_back(static_cast<const char*>(zmq_msg_data(&m)), zmq_msg_size(&m));
      more = zmq_msg_more(&m);
      zmq_msg_close(&m);
    }
    if (parts.size() != 3 || parts[2].size() != 8) {
      PAGODA_LOG_WARN("kv events: malformed replay request (%zu frames) ignored", parts.size());
      continue;
    }
    replay_requests_.fetch_add(1, std::memory_order_relaxed);
    const uint64_t start = get_be64(parts[2].data());
    const std::string& id = parts[0];
    auto send3 = [&](const char* seq, const std::string& payload) {
      zmq_send(replay_, id.data(), id.size(), ZMQ_SNDMORE);
      zmq_send(replay_, "", 0, ZMQ_SNDMORE);
      zmq_send(replay_, seq, 8, ZMQ_SNDMORE);
      zmq_send(replay_, payload.data(), payload.size(), 0);
    };
    for (const auto& [seq, payload] : buffer_) {
      if (seq < start) continue;
      char be[8];
      put_be64(seq, be);
      send3(be, payload);
    }
    const char end[8] = {'\xff', '\xff', '\xff', '\xff', '\xff', '\xff', '\xff', '\xff'};
    send3(end, std::string());
  }
}

void Publisher::run() {
  for (;;) {
    if (replay_) {
      zmq_pollitem_t item{replay_, 0, ZMQ_POLLIN, 0};
      zmq_poll(&item, 1, 0);
      if (item.revents & ZMQ_POLLIN) serve_replay();
    }
    std::deque<std::vector<KvEvent>> work;
    {
      std::unique_lock<std::mutex> l(mu_);
      if (queue_.empty()) {
        busy_ = false;
        idle_cv_.notify_all();
        if (stop_) return;
        // Wake for a batch, or every 5 ms to answer replay requests.
        work_cv_.wait_for(l, std::chrono::milliseconds(replay_ ? 5 : 50), [&] { return !queue_.empty() || stop_; });
        if (queue_.empty()) continue;
      }
      work.swap(queue_);
      busy_ = true;
    }
    for (auto& events : work) send_batch(events);
    // Replay requests between batches keep their answers in sequence order.
  }
}

}  // namespace pagoda::kv_events
