// pagoda serve: the OpenAI-compatible HTTP server.
#include <csignal>
#include <cstdio>

#include "base/log.h"
#include "cli/command.h"
#include "cli/engine_flags.h"
#include "server/server.h"

namespace pagoda::cli {
namespace {

server::Server* g_server = nullptr;
void on_signal(int) {
  if (g_server) g_server->stop();
}

const char* kHelp =
    "usage: pagoda serve [options]\n"
    "  --host ADDR                   listen address (default 127.0.0.1)\n"
    "  --port N                      listen port (default 8080; 0 picks a free one)\n"
    "  --max-waiting N               answer 503 when more requests wait (default 1024)\n"
    "  --api-key KEY                 require 'Authorization: Bearer KEY' on /v1/*\n"
    "  --served-model-name NAME      model id in the API (default: the file's stem)\n"
    "Every flag can also be set as PAGODA_<FLAG> (e.g. PAGODA_PORT=9000).\n";

int serve_main(int argc, char** argv) {
  Args args(argc, argv);
  if (args.help()) {
    std::fprintf(stdout, "%s%s", kHelp, kEngineFlagsHelp);
    return 0;
  }
  engine::EngineConfig ecfg;
  server::ServerConfig scfg;
  std::string err = parse_engine_flags(args, &ecfg);
  std::string v;
  if (err.empty() && args.value("--host", &v)) scfg.http.host = v;
  if (err.empty() && args.value("--port", &v)) {
    char* end = nullptr;
    long p = std::strtol(v.c_str(), &end, 10);
    if (*end || p < 0 || p > 65535) err = "--port must be in 0..65535, got '" + v + "'";
    scfg.http.port = static_cast<int>(p);
  }
  if (err.empty() && args.value("--max-waiting", &v)) {
    char* end = nullptr;
    long p = std::strtol(v.c_str(), &end, 10);
    if (*end || p < 0) err = "--max-waiting must be a non-negative integer, got '" + v + "'";
    scfg.max_waiting = static_cast<int>(p);
  }
  if (err.empty() && args.value("--api-key", &v)) scfg.api_key = v;
  if (err.empty() && args.value("--served-model-name", &v)) scfg.served_model_name = v;
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
  PAGODA_LOG_INFO("listening on http://%s:%d", scfg.http.host.c_str(), *port);
  std::fflush(stderr);
  g_server = srv->get();
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::signal(SIGPIPE, SIG_IGN);
  (*srv)->run();
  g_server = nullptr;
  return 0;
}

Register reg("serve", "OpenAI-compatible HTTP server (completions, chat, streaming, metrics)", serve_main);

}  // namespace
}  // namespace pagoda::cli
