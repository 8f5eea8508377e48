// The KV event publisher (issue 37): vLLM's ZmqEventPublisher in pagoda.
//
// The engine thread hands one EventBatch per step to publish(), which only
// moves it into a bounded queue (max_queue_size batches; a full queue drops
// the batch and counts it) and never waits. ONE publisher thread owns both
// ZeroMQ sockets: it numbers each batch (8-byte big-endian sequence number
// from 0, +1 per message), encodes it (events.h), sends
// [topic, seq, payload] on the PUB socket (high-water mark hwm; a subscriber
// that falls behind loses messages at the socket, never slows the engine) and
// keeps the last buffer_steps messages for the ROUTER replay socket: a DEALER
// sends [b"", start_seq (8 bytes BE)] and gets [b"", seq, payload] for every
// buffered message from start_seq on, then [b"", -1 (8 x 0xff), b""].
// Endpoints with '*', '::', ipc:// or inproc:// are bound, others connected.
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

#include "base/status.h"
#include "kv_events/events.h"

namespace pagoda::kv_events {

// vLLM's --kv-events-config keys.
struct KvEventsConfig {
  bool enable_kv_cache_events = false;
  std::string publisher = "null";  // "zmq" or "null" (off)
  std::string endpoint = "tcp://*:5557";
  std::string replay_endpoint;  // "": no replay socket
  std::string topic;
  int64_t buffer_steps = 10000;  // messages kept for replay
  int64_t hwm = 100000;          // the PUB socket's send high-water mark (messages)
  int64_t max_queue_size = 100000;  // batches waiting for the publisher thread
  bool enabled() const { return enable_kv_cache_events && publisher == "zmq"; }
  // Parses the JSON object of --kv-events-config. Errors name the key: not an
  // object, an unknown key, a wrong type, an unknown publisher, a bad number.
  static Expected<KvEventsConfig> parse(const std::string& json_text);
};

struct PublisherStats {
  int64_t batches_published = 0;  // messages queued for the PUB socket (each gets a sequence number)
  int64_t events_published = 0;   // events in them
  int64_t batches_dropped = 0;    // batches dropped by a full queue (never sent, no sequence number)
  int64_t events_dropped = 0;
  int64_t replay_requests = 0;
};

class Publisher {
 public:
  // Binds/connects both sockets and starts the thread. Errors: a socket that
  // cannot be bound or connected (the endpoint named).
  static Expected<std::unique_ptr<Publisher>> start(const KvEventsConfig& config);
  ~Publisher();  // sends what is queued, then stops
  Publisher(const Publisher&) = delete;
  Publisher& operator=(const Publisher&) = delete;

  // Queues one batch (one message); never blocks. An empty batch is ignored.
  void publish(std::vector<KvEvent> events);
  // Waits until every queued batch is sent (tests, shutdown).
  void flush();
  PublisherStats stats() const;

 private:
  explicit Publisher(const KvEventsConfig& config) : cfg_(config) {}
  Status open();
  void run();
  void serve_replay();
  void send_batch(std::vector<KvEvent>& events);

  KvEventsConfig cfg_;
  void* ctx_ = nullptr;
  void* pub_ = nullptr;
  void* replay_ = nullptr;
  std::thread thread_;
  mutable std::mutex mu_;
  std::condition_variable idle_cv_;  // the queue ran empty (flush)
  std::condition_variable work_cv_;  // a batch was queued, or stop
  std::deque<std::vector<KvEvent>> queue_;
  bool busy_ = false;
  bool stop_ = false;
  uint64_t next_seq_ = 0;
  std::deque<std::pair<uint64_t, std::string>> buffer_;  // publisher thread only
  std::atomic<int64_t> batches_published_{0}, events_published_{0}, batches_dropped_{0}, events_dropped_{0},
      replay_requests_{0};
};

}  // namespace pagoda::kv_events
