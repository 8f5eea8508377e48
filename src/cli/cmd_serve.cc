// pagoda serve: the OpenAI-compatible HTTP server.
#include <fstream>
#include <sstream>
#include <cstdio>
#include <cctype>
#include <cstdlib>

#include "base/log.h"
#include "base/log_control.h"
#include "cli/cli_util.h"
#include "cli/command.h"
#include "cli/engine_flags.h"
#include "server/server.h"

namespace pagoda::cli {
namespace {

const char* kHelp =
    "usage: pagoda serve [MODEL] [options]\n"
    "  --host ADDR                   listen address (default 127.0.0.1)\n"
    "  --port N                      listen port (default 8080; 0 picks a free one)\n"
    "  --max-waiting N               answer 503 when more requests wait, to be parsed or in the\n"
    "                                engine's queue (default 1024)\n"
    "  --max-connections N           open connections beyond N get 503 (default: sized to the\n"
    "                                descriptor limit, RLIMIT_NOFILE minus max(32, 1/8))\n"
    "  --api-key KEY[,KEY...]        require 'Authorization: Bearer KEY' (or 'x-api-key: KEY') on every\n"
    "                                route but /health\n"
    "  --metrics-without-key         leave /metrics open when --api-key is set\n"
    "  --prefix-cache-salt-per-key   prefix cache entries of one API key are never hits for another;\n"
    "                                the dashboard shows each key only its own requests and blocks\n"
    "  --dashboard-admin-key KEY     a key that opens the /dashboard routes and sees every tenant\n"
    "  --parse-special-in-prompts    control-token text in prompts becomes control tokens (default:\n"
    "                                plain text, so a user cannot forge a turn)\n"
    "  --api-key-file FILE           the keys of --api-key, one per line ('#' comments, blank lines skipped)\n"
    "  --served-model-name NAME      model id in the API and the model_name metric label (default: the\n"
    "                                file's stem); or -a/--alias (llama-server)\n"
    "  --chat-template FILE|TEXT     Jinja chat template replacing the model's tokenizer.chat_template\n"
    "                                (a file, or the template itself; or --chat-template-file FILE)\n"
    "  --seed N                      requests without a seed draw theirs from a stream seeded by N\n"
    "                                (-1: random, the default); or -s\n"
    "  --allowed-origins LIST        CORS origins, comma-separated or a JSON list (default *; '' = off)\n"
    "  --log-stats-interval S        a stats line every S seconds with activity (default 10; 0 = off);\n"
    "                                --disable-log-stats = 0\n"
    "  --disable-log-requests        no access line per request\n"
    "  --metrics-name-prefix P       /metrics series read P:name (default pagoda; vllm for vLLM dashboards)\n"
    "  --worker-threads N            threads that parse and tokenize requests (default 2)\n"
    "  --max-body-bytes SIZE         request body limit (default 8MiB)\n"
    "  --max-stop-bytes N            longest stop string (default 1024)\n"
    "  --max-cache-salt-bytes N      longest cache_salt (default 256)\n"
    "  --max-output-entries N        bound on prompts x n x max_tokens x (1 + logprobs) (default 1048576)\n"
    "  --send-timeout N              seconds a client may take no bytes before it is dropped (default 30)\n"
    "  --version, -V                 print the version and exit\n"
    "Every flag can also be set as PAGODA_<FLAG> (e.g. PAGODA_PORT=9000).\n";

// "a,b" or a JSON list '["a", "b"]' (vLLM's spelling) -> {"a", "b"}.
std::vector<std::string> split_list(std::string v) {
  std::vector<std::string> out;
  if (!v.empty() && v.front() == '[' && v.back() == ']') v = v.substr(1, v.size() - 2);
  size_t start = 0;
  while (start <= v.size()) {
    size_t comma = v.find(',', start);
    if (comma == std::string::npos) comma = v.size();
    std::string item = v.substr(start, comma - start);
    while (!item.empty() && (item.front() == ' ' || item.front() == '"' || item.front() == '\'')) item.erase(0, 1);
    while (!item.empty() && (item.back() == ' ' || item.back() == '"' || item.back() == '\'')) item.pop_back();
    if (!item.empty()) out.push_back(item);
    start = comma + 1;
  }
  return out;
}

int serve_main(int argc, char** argv) {
  Args args(argc, argv);
  if (args.help()) {
    print_usage(kHelp, kEngineFlagsHelp);
    return print_usage(kLogFlagsHelp);
  }
  if (args.version()) {
    std::printf("pagoda %s\n", version_string());
    return 0;
  }
  engine::EngineConfig ecfg;
  server::ServerConfig scfg;
  std::string err = parse_log_flags(args);
  if (err.empty()) err = parse_engine_flags(args, &ecfg);
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
  if (err.empty() && args.value("--api-key-file", &v)) {
    // A file keeps keys out of the process list and the shell history.
    std::ifstream f(v);
    if (!f) {
      err = "--api-key-file: cannot read " + v;
    } else {
      size_t before = scfg.api_keys.size();
      for (std::string line; std::getline(f, line);) {
        while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) line.pop_back();
        size_t b = line.find_first_not_of(" \t");
        if (b == std::string::npos || line[b] == '#') continue;
        scfg.api_keys.push_back(line.substr(b));
      }
      if (scfg.api_keys.size() == before) err = "--api-key-file: " + v + " holds no key";
    }
  }
  if (err.empty() && args.value("--seed", &v, "-s")) {
    if (!parse_int(v, INT64_MIN, INT64_MAX, &n)) {
      err = "--seed must be an integer, got '" + v + "'";
    } else if (n != -1) {  // llama.cpp's -1: random
      scfg.has_seed = true;
      scfg.seed = static_cast<uint64_t>(n);
    }
  }
  if (err.empty() && args.value("--allowed-origins", &v)) scfg.http.allowed_origins = split_list(v);
  if (err.empty() && args.value("--log-stats-interval", &v)) {
    double s = 0;
    if (!parse_f64(v, &s) || !(s >= 0 && s <= 86400)) err = "--log-stats-interval must be seconds in 0..86400, got '" + v + "'";
    scfg.log_stats_interval_s = s;
  }
  if (args.flag("--disable-log-stats")) scfg.log_stats_interval_s = 0;
  if (args.flag("--disable-log-requests")) scfg.log_requests = false;
  args.flag("--metrics");  // llama-server's switch: /metrics is always on
  if (err.empty() && args.value("--metrics-name-prefix", &v)) {
    bool ok = !v.empty() && !std::isdigit(static_cast<unsigned char>(v[0]));
    for (char c : v) ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '_');
    if (!ok) err = "--metrics-name-prefix must be letters, digits and '_' (not starting with a digit), got '" + v + "'";
    scfg.metrics_name_prefix = v;
  }
  scfg.metrics_without_key = args.flag("--metrics-without-key");
  scfg.prefix_cache_salt_per_key = args.flag("--prefix-cache-salt-per-key");
  if (err.empty() && args.value("--dashboard-admin-key", &v)) {
    if (v.empty()) err = "--dashboard-admin-key needs a non-empty key";
    scfg.dashboard_admin_key = v;
  }
  scfg.parse_special_in_prompts = args.flag("--parse-special-in-prompts");
  if (err.empty() && (args.value("--served-model-name", &v) || args.value("--alias", &v, "-a"))) scfg.served_model_name = v;
  if (err.empty() && args.value("--chat-template-file", &v)) {
    if (!read_file(v, &scfg.chat_template)) err = "--chat-template-file: cannot read " + v;
  }
  if (err.empty() && args.value("--chat-template", &v)) {
    // vLLM takes a file or the template text; text is anything with a Jinja tag.
    if (!read_file(v, &scfg.chat_template)) {
      if (v.find("{{") != std::string::npos || v.find("{%") != std::string::npos) scfg.chat_template = v;
      else err = "--chat-template: cannot read " + v + " (give a file, or the template text itself)";
    }
  }
  if (err.empty() && scfg.prefix_cache_salt_per_key && scfg.api_keys.empty())
    err = "--prefix-cache-salt-per-key needs --api-key";
  if (err.empty()) err = finish_engine_flags(args, &ecfg);
  // Per-key salts put a tenant tag into every tier entry's key: without a
  // secret, whoever reads the store could test guessed keys against the names.
  if (err.empty() && scfg.prefix_cache_salt_per_key && (!ecfg.kv_disk_dir.empty() || !ecfg.kv_redis.empty()) &&
      ecfg.kv_tier_secret.empty())
    err = "--prefix-cache-salt-per-key with a KV tier (--kv-disk-dir, --kv-redis) needs --kv-tier-secret or "
          "--kv-tier-secret-file";
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
  PAGODA_LOG_INFO("pagoda %s: model %s (%s), context %d tokens, KV %lld bytes per token, %d threads", version_string(),
                  info.name.c_str(), info.architecture.c_str(), info.context_length,
                  static_cast<long long>(info.kv_bytes_per_token), ecfg.threads);
  const std::string kv_types = info.kv_dtype.same() ? kv_dtype_name(info.kv_dtype.k)
                                                   : "K " + std::string(kv_dtype_name(info.kv_dtype.k)) + ", V " +
                                                         kv_dtype_name(info.kv_dtype.v);
  PAGODA_LOG_INFO("KV cache: %d blocks x %d tokens = %lld tokens, %.1f MiB, %s", info.num_kv_blocks, info.block_size,
                  static_cast<long long>(info.kv_cache_tokens), info.kv_cache_bytes / 1048576.0, kv_types.c_str());
  // One arithmetic with the allocator: blocks (all KV groups) a context-length
  // sequence holds (kv/sizing's kv_blocks_for_sequence; sliding-window groups
  // only their window).
  PAGODA_LOG_INFO("Maximum concurrency for %lld tokens per request: %.2fx (%lld blocks each, %zu KV group(s) of %d layers)",
                  static_cast<long long>(per_request),
                  info.kv_blocks_per_context > 0
                      ? static_cast<double>(info.num_kv_blocks - 1) / static_cast<double>(info.kv_blocks_per_context)
                      : 0.0,
                  static_cast<long long>(info.kv_blocks_per_context), info.kv_group_windows.size(), info.kv_group_size);
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
  server::Server* s = srv->get();
  return run_until_signal([s] { s->run(); }, [s] { s->stop(); });
}

Register reg("serve", "OpenAI-compatible HTTP server (completions, chat, streaming, metrics)", serve_main);

}  // namespace
}  // namespace pagoda::cli
