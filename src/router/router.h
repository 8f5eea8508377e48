// `pagoda router`: an OpenAI-compatible front for several `pagoda serve`
// replicas. It serves the same routes (/v1/completions, /v1/chat/completions,
// /v1/models, /tokenize, /detokenize, /health, /metrics), passes each generation
// to one replica chosen by prefix affinity (consistent hashing of the prompt's
// first blocks or its prompt_cache_key, bounded load; ring.h) or, with
// --kv-events, by the replicas' own KV events (kv_subscriber.h), streams SSE through as it arrives,
// health-checks the replicas, retries a request on another replica while nothing
// of its answer was sent, and counts all of it on its own /metrics. Its I/O is
// asynchronous (upstream.h, proxy.h): a bounded number of threads at any
// concurrency.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "http/http.h"
#include "router/upstream.h"

namespace pagoda::router {

class Exchange;

enum class Policy { kPrefix, kRoundRobin, kLeastLoaded };
// "prefix", "round-robin", "least-loaded"; false on another name.
bool parse_policy(const std::string& name, Policy* out);

struct RouterConfig {
  server::HttpConfig http;
  std::vector<std::string> replicas;  // http://host:port URLs, at least one
  std::string model_path;             // GGUF whose tokenizer and chat template read prompts ("": none)
  Policy policy = Policy::kPrefix;
  int block_size = 16;                // tokens per hashed block (the replicas' KV block size)
  int affinity_blocks = 8;            // the key covers the first this many whole blocks
  double max_imbalance = 0.5;         // ring.h load_limit
  double health_interval_s = 2;       // between GET /health rounds
  UpstreamTimeouts timeouts;
  int max_in_flight = 4096;           // requests being proxied or queued beyond this get 503
  int workers = 2;                    // threads reading prompts for routing (parse, tokenize); more queue
  int keepalive_per_replica = 16;     // idle keep-alive connections kept per replica (0: one per request)
  size_t max_response_bytes = size_t{256} << 20;  // a non-streamed answer larger than this is a 502
  // --kv-events (issue 37): route to the replica holding the longest prefix by
  // its KV events (kv_subscriber.h, kv_index.h); the ring when none holds any.
  bool kv_events = false;
  std::vector<std::string> kv_event_endpoints;   // per replica, in --replica order ("": tcp://HOST:5557)
  std::vector<std::string> kv_replay_endpoints;  // per replica ("": tcp://HOST:5558; "none": no replay)
  double kv_tier_weight = 0.5;                   // kv_index.h kv_score
  double kv_replay_timeout_s = 1.0;              // longest wait for a replay answer
  int kv_min_match = 1;                          // route on the events only when >= this many blocks match
  double kv_match_threshold = 0.5;               // kv_index.h KvRouting::match_threshold
  double kv_max_imbalance = 2.0;                 // kv_index.h KvRouting::hold_imbalance
};

class Router {
 public:
  // Checks the config, parses the replica URLs, loads the tokenizer.
  static Expected<std::unique_ptr<Router>> create(const RouterConfig& config);
  ~Router();  // cancels the requests in flight and waits for their threads
  // Binds (port 0 picks a free one) after one health round. Returns the port.
  Expected<int> start();
  void run();   // blocks until stop()
  void stop();  // thread-safe

 private:
  Router() = default;
  friend class Exchange;  // proxy.h: one proxied request
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pagoda::router
