// pagoda serve: the OpenAI-compatible HTTP server.
#include <atomic>
#include <chrono>
#include <csignal>
#include <fstream>
#include <sstream>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "base/log.h"
#include "cli/cli_util.h"
#include "cli/command.h"
#include "cli/engine_flags.h"
#include "server/server.h"

namespace pagoda::cli {
namespace {

// The handler only sets this flag (a lock-free atomic store is async-signal-safe);
// a watcher thread polls it and stops the server outside signal context.
std::atomic<int> g_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);
void on_signal(int sig) { g_signal.store(sig); }

const char* kHelp =
    "usage: pagoda serve [options]\n"
    "  --host ADDR                   listen address (default 127.0.0.1)\n"
    "  --port N                      listen port (default 8080; 0 picks a free one)\n"
    "  --max-waiting N               answer 503 when more requests wait (default 1024)\n"
    "  --max-connections N           open connections beyond N get 503 (default: sized to the\n"
    "                                descriptor limit, RLIMIT_NOFILE minus max(32, 1/8))\n"
    "  --api-key KEY[,KEY...]        require 'Authorization: Bearer KEY' on every route but /health\n"
    "  --metrics-without-key         leave /metrics open when --api-key is set\n"
    "  --prefix-cache-salt-per-key   prefix cache entries of one API key are never hits for another\n"
    "  --parse-special-in-prompts    control-token text in prompts becomes control tokens (default:\n"
    "                                plain text, so a user cannot forge a turn)\n"
    "  --served-model-name NAME      model id in the API (default: the file's stem)\n"
    "  --chat-template FILE          Jinja chat template replacing the model's tokenizer.chat_template\n"
    "  --worker-threads N            threads that parse and tokenize requests (default 2)\n"
    "  --max-body-bytes SIZE         request body limit (default 8MiB)\n"
    "  --max-stop-bytes N            longest stop string (default 1024)\n"
    "  --max-cache-salt-bytes N      longest cache_salt (default 256)\n"
    "  --max-output-entries N        bound on prompts x n x max_tokens x (1 + logprobs) (default 1048576)\n"
    "  --send-timeout N              seconds a client may take no bytes before it is dropped (default 30)\n"
    "Every flag can also be set as PAGODA_<FLAG> (e.g. PAGODA_PORT=9000).\n";

int serve_main(int argc, char** argv) {
  Args args(argc, argv);
  if (args.help()) return print_usage(kHelp, kEngineFlagsHelp);
  engine::EngineConfig ecfg;
  server::ServerConfig scfg;
  std::string err = parse_engine_flags(args, &ecfg);
  std::string v;
  int64_t n = 0;
  auto int_opt = [&](const char* name, int64_t lo, int64_t hi, auto* field) {
    if (!err.empty()) return;
    n = static_cast<int64_t>(*field);
    err = int_option(args, name, lo, hi, &n);
    *field = static_cast<std::remove_reference_t<decltype(*field)>>(n);
  };
  if (err.empty() && args.value("--host", &v)) scfg.http.host = v;
  int_opt("--port", 0, 65535, &scfg.http.port);
  int_opt("--max-waiting", 0, INT32_MAX, &scfg.max_waiting);
  int_opt("--max-connections", 1, 1 << 20, &scfg.http.max_connections);
  int_opt("--worker-threads", 1, 256, &scfg.worker_threads);
  int_opt("--max-stop-bytes", 1, 1 << 20, &scfg.limits.max_stop_bytes);
  int_opt("--max-cache-salt-bytes", 1, 1 << 16, &scfg.limits.max_cache_salt_bytes);
  int_opt("--max-output-entries", 1, int64_t{1} << 40, &scfg.limits.max_output_entries);
  int_opt("--send-timeout", 1, 86400, &scfg.http.send_timeout_s);
  if (err.empty() && args.value("--max-body-bytes", &v)) {
    int64_t b = 0;
    if (!parse_bytes(v, &b) || b < 1024 || b > (int64_t{1} << 32)) err = "--max-body-bytes must be 1KiB..4GiB, got '" + v + "'";
    scfg.http.body_limit = static_cast<size_t>(b);
  }
  if (err.empty() && args.value("--api-key", &v)) {
    size_t start = 0;
    while (start <= v.size()) {
      size_t comma = v.find(',', start);
      if (comma == std::string::npos) comma = v.size();
      if (comma > start) scfg.api_keys.push_back(v.substr(start, comma - start));
      start = comma + 1;
    }
    if (scfg.api_keys.empty()) err = "--api-key needs at least one non-empty key";
  }
  scfg.metrics_without_key = args.flag("--metrics-without-key");
  scfg.prefix_cache_salt_per_key = args.flag("--prefix-cache-salt-per-key");
  scfg.parse_special_in_prompts = args.flag("--parse-special-in-prompts");
  if (err.empty() && args.value("--served-model-name", &v)) scfg.served_model_name = v;
  if (err.empty() && args.value("--chat-template", &v)) {
    std::ifstream f(v, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    if (!f) err = "--chat-template: cannot read " + v;
    else scfg.chat_template = ss.str();
  }
  if (err.empty() && scfg.prefix_cache_salt_per_key && scfg.api_keys.empty())
    err = "--prefix-cache-salt-per-key needs --api-key";
  if (err.empty()) err = args.leftover();
  if (!err.empty()) {
    std::fprintf(stderr, "pagoda serve: %s\n", err.c_str());
    return 2;
  }
  auto eng = engine::Engine::create(ecfg);
  if (!eng.ok()) {
    std::fprintf(stderr, "pagoda serve: %s\n", eng.message().c_str());
    return 1;
  }
  const engine::ModelInfo info = (*eng)->model_info();
  const int64_t per_request = static_cast<int64_t>(info.context_length);
  PAGODA_LOG_INFO("model %s (%s), context %d tokens, KV %lld bytes per token", info.name.c_str(),
                  info.architecture.c_str(), info.context_length, static_cast<long long>(info.kv_bytes_per_token));
  PAGODA_LOG_INFO("KV cache: %d blocks x %d tokens = %lld tokens, %.1f MiB", info.num_kv_blocks, info.block_size,
                  static_cast<long long>(info.kv_cache_tokens), info.kv_cache_bytes / 1048576.0);
  PAGODA_LOG_INFO("Maximum concurrency for %lld tokens per request: %.2fx", static_cast<long long>(per_request),
                  per_request > 0 ? static_cast<double>(info.kv_cache_tokens) / per_request : 0.0);
  auto srv = server::Server::create(scfg, std::move(eng).value());
  if (!srv.ok()) {
    std::fprintf(stderr, "pagoda serve: %s\n", srv.message().c_str());
    return 1;
  }
  auto port = (*srv)->start();
  if (!port.ok()) {
    std::fprintf(stderr, "pagoda serve: %s\n", port.message().c_str());
    return 1;
  }
  PAGODA_LOG_INFO("listening on http://%s:%d (at most %d connections)", scfg.http.host.c_str(), *port,
                  scfg.http.max_connections > 0 ? scfg.http.max_connections : server::default_max_connections());
  std::fflush(stderr);
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::signal(SIGPIPE, SIG_IGN);
  server::Server* s = srv->get();
  std::atomic<bool> done{false};
  std::thread watcher([&] {
    while (!done.load() && g_signal.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (g_signal.load() != 0) s->stop();
  });
  (*srv)->run();
  done = true;
  watcher.join();
  return 0;
}

Register reg("serve", "OpenAI-compatible HTTP server (completions, chat, streaming, metrics)", serve_main);

}  // namespace
}  // namespace pagoda::cli
