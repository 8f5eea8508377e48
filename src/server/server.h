// `pagoda serve`: OpenAI-compatible routes over HttpServer + AsyncEngine. The I/O
// threads only route, authenticate and answer the cheap routes (/health, /metrics,
// /v1/models); parsing, tokenizing and chat rendering run on a bounded worker pool.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "grammar/cache.h"
#include "grammar/grammar.h"
#include "http/http.h"
#include "openai/openai_api.h"

namespace pagoda::server {

struct ServerConfig {
  HttpConfig http;
  std::vector<std::string> api_keys;  // empty: no auth; else any of them is accepted
  bool metrics_without_key = false;   // leave /metrics open when api_keys are set
  // The prefix cache salt of every request starts with a hash of its API key, so
  // one tenant's cached prompts are never hits (nor timing probes) for another.
  bool prefix_cache_salt_per_key = false;
  // With per-key salts the dashboard shows each key only its own requests, blocks,
  // prefix tree and block text; this key (--dashboard-admin-key) sees everything.
  // It opens the /dashboard routes only (not the API). "": no admin.
  std::string dashboard_admin_key;
  // Control-token text in completion prompts given as text (and, once tok/ supports
  // it, in chat content) becomes control tokens. Off: it is plain text (vLLM's default).
  bool parse_special_in_prompts = false;
  std::string served_model_name;  // empty: the model file's stem
  std::string chat_template;      // Jinja source replacing the model's own ("": the model's)
  int max_waiting = 1024;         // more waiting requests than this -> 503
  int worker_threads = 2;         // parsing / tokenizing threads
  // Jobs waiting for a worker (parse, tokenize) beyond this -> 503; 0: max_waiting.
  // Requests waiting to be parsed count against max_waiting like the engine's.
  int worker_queue = 0;
  // A worker job during which anonymous resident memory grew by more than this
  // gives free heap pages back to the OS afterwards (WorkerPool, HeapReturn); 0: never.
  size_t heap_trim_threshold = 8u << 20;
  RequestLimits limits;
  // Structured outputs: limits on what one constraint may compile to (hostile
  // schemas and regexes fail with a 400 naming the limit), and how many distinct
  // compiled constraints (with their learned token masks) are kept.
  grammar::GrammarOptions grammar_limits;
  int grammar_cache_size = 64;
  size_t grammar_cache_bytes = grammar::GrammarCache::kDefaultMaxBytes;  // compiled grammars and their masks
  // Logs: a vLLM-style stats line every this many seconds in which something
  // happened (0: none). The access line of each request is always logged (info).
  double log_stats_interval_s = 10;
  bool log_requests = true;  // the access line of each generation request
  // Metrics: series read "<prefix>:name" (vLLM's dashboards want "vllm") and carry
  // model_name="<served model name>".
  std::string metrics_name_prefix = "pagoda";
  // --seed: requests that give no seed get one drawn from a stream seeded by this,
  // so a restarted server answers the same sequence of requests alike.
  bool has_seed = false;
  uint64_t seed = 0;
};

class Server {
 public:
  static Expected<std::unique_ptr<Server>> create(const ServerConfig& config, std::unique_ptr<engine::Engine> engine);
  ~Server();
  // Binds the port (0 picks a free one). Returns the bound port.
  Expected<int> start();
  void run();   // blocks until stop()
  void stop();  // thread-safe; not async-signal-safe (see cmd_serve.cc)

 private:
  Server() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pagoda::server
