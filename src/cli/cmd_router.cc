// pagoda router: a prefix-aware OpenAI-compatible front for several `pagoda serve`
// replicas (src/router/).
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "base/log.h"
#include "cli/cli_util.h"
#include "cli/command.h"
#include "cli/engine_flags.h"
#include "router/router.h"

namespace pagoda::cli {
namespace {

const char* kRouterHelp =
    "usage: pagoda router --replica URL [--replica URL ...] [options]\n"
    "  --replica URL[,URL...]   a `pagoda serve` (or any OpenAI-compatible server) to route to;\n"
    "                           repeat the flag or separate URLs with commas\n"
    "  --host ADDR              listen address (default 127.0.0.1)\n"
    "  --port N                 listen port (default 8000; 0 picks a free one)\n"
    "  -m, --model GGUF         model whose tokenizer and chat template read prompts (default:\n"
    "                           $PAGODA_MODEL or models/SmolLM2-135M-Instruct.Q4_1.gguf when it\n"
    "                           exists; 'none': token-id prompts only, text and chat prompts go\n"
    "                           to the least-loaded replica)\n"
    "  --policy P               prefix (default): consistent hashing of the prompt's first blocks\n"
    "                           with a load bound; round-robin; least-loaded\n"
    "  --block-size N           tokens per hashed block (default 16, the replicas' KV block size)\n"
    "  --affinity-blocks N      the routing key covers the first N whole blocks (default 8)\n"
    "  --max-imbalance F        a replica with more than (1+F) x mean + 1 requests in flight takes\n"
    "                           no new affinity request: the next on the ring does (default 0.5)\n"
    "  --health-interval S      seconds between GET /health rounds (default 2)\n"
    "  --request-timeout S      longest wait for a replica's head or next bytes (default 600)\n"
    "  --max-in-flight N        requests being proxied or queued beyond N get 503 (default 4096)\n"
    "  --workers N              threads reading prompts for routing (parse, tokenize; default 2);\n"
    "                           the proxying itself is asynchronous, on one event loop\n"
    "  --upstream-keepalive N   idle keep-alive connections kept per replica (default 16; 0: a new\n"
    "                           connection per request)\n"
    "  --kv-events              route on the replicas' KV events (their `--kv-events-config`): each\n"
    "                           request goes to the replica holding the longest prefix of its prompt\n"
    "                           (a RAM block counts 1, a disk/redis one --kv-tier-weight), within the\n"
    "                           load bound of --max-imbalance; the ring when none holds any of it\n"
    "  --kv-events-endpoint E[,E...]  each replica's event PUB endpoint, in --replica order\n"
    "                           (default tcp://REPLICA_HOST:5557; an empty item keeps the default)\n"
    "  --kv-replay-endpoint E[,E...]  each replica's replay ROUTER endpoint, same order (default\n"
    "                           tcp://REPLICA_HOST:5558; 'none': a gap drops the replica's entries)\n"
    "  --kv-tier-weight F       what a block held only on a disk/redis tier counts against a RAM one\n"
    "                           (default 0.5: a tier prefix must be twice as long to win; 0..1)\n"
    "  --kv-replay-timeout S    longest wait for a replay answer (default 1)\n"
    "  --kv-min-match N         route on the events only when a replica holds at least N leading\n"
    "                           blocks of the prompt (any medium); shorter matches go by the ring\n"
    "                           (default 1)\n"
    "  --kv-match-threshold F   follow a match only when it covers at least F of the prompt's whole\n"
    "                           blocks (SGLang's cache_threshold); a shorter one (a shared system\n"
    "                           prompt) goes by the ring keyed past it, so such prompts spread\n"
    "                           (default 0.5; 0: follow every match)\n"
    "  --kv-max-imbalance F     the load bound of a replica holding a followed match: it takes the\n"
    "                           request until it has more than (1+F) x mean + 1 in flight (default 2,\n"
    "                           never below --max-imbalance: a hit saves a prefill)\n"
    "A request's prompt_cache_key, when present, is its ring key instead of its first blocks.\n"
    "Prompts shorter than one block go to the least-loaded replica. A request is retried on\n"
    "another replica when its replica fails (connection error, 5xx) before any byte of the\n"
    "answer was sent; a stream cut after that ends with an SSE error event and [DONE].\n";

int router_main(int argc, char** argv) {
  // The one parser of every subcommand: --replica may repeat (PAGODA_REPLICA when
  // none is given), each value a comma list.
  Args args(argc, argv);
  std::string err;
  // Each value a comma list; keep_empty keeps "" items (a per-replica default).
  auto comma_list = [&](const char* name, bool keep_empty) {
    std::vector<std::string> out;
    for (const std::string& v : args.list(name)) {
      size_t start = 0;
      while (start <= v.size()) {
        size_t comma = v.find(',', start);
        if (comma == std::string::npos) comma = v.size();
        if (comma > start || keep_empty) out.push_back(v.substr(start, comma - start));
        start = comma + 1;
      }
    }
    return out;
  };
  std::vector<std::string> replicas = comma_list("--replica", false);
  router::RouterConfig cfg;
  cfg.kv_events = args.flag("--kv-events");
  cfg.kv_event_endpoints = comma_list("--kv-events-endpoint", true);
  cfg.kv_replay_endpoints = comma_list("--kv-replay-endpoint", true);
  cfg.http.port = 8000;
  std::string v;
  if (err.empty() && args.value("--host", &v)) cfg.http.host = v;
  if (err.empty()) err = int_option(args, "--port", 0, 65535, &cfg.http.port);
  if (err.empty() && args.value("--model", &v, "-m")) {
    cfg.model_path = v == "none" ? "" : v;
  } else if (const std::string d = default_model_path(); std::filesystem::exists(d)) {
    cfg.model_path = d;
  } else {
    // Not asked for by name: route without a tokenizer rather than refuse to start.
    PAGODA_LOG_WARN("router: no --model and no %s: token-id prompts only; text and chat prompts go to the "
                    "least-loaded replica", d.c_str());
  }
  if (err.empty() && args.value("--policy", &v) && !router::parse_policy(v, &cfg.policy))
    err = "--policy must be prefix, round-robin or least-loaded, got '" + v + "'";
  if (err.empty()) err = int_option(args, "--block-size", 1, 1 << 16, &cfg.block_size);
  if (err.empty()) err = int_option(args, "--affinity-blocks", 1, 1 << 20, &cfg.affinity_blocks);
  if (err.empty()) err = int_option(args, "--max-in-flight", 1, 1 << 20, &cfg.max_in_flight);
  if (err.empty()) err = int_option(args, "--workers", 1, 1 << 14, &cfg.workers);
  if (err.empty()) err = int_option(args, "--upstream-keepalive", 0, 1 << 14, &cfg.keepalive_per_replica);
  int kv_min_match = 0;  // 0: not given
  if (err.empty()) err = int_option(args, "--kv-min-match", 1, 1 << 20, &kv_min_match);
  if (kv_min_match > 0) cfg.kv_min_match = kv_min_match;
  auto dbl = [&](const char* name, double lo, double hi, double* out) {
    if (!err.empty() || !args.value(name, &v)) return;
    double d = 0;
    if (!parse_f64(v, &d) || !(d >= lo && d <= hi))
      err = std::string(name) + " must be a number in " + std::to_string(lo) + ".." + std::to_string(hi) + ", got '" +
            v + "'";
    else
      *out = d;
  };
  dbl("--max-imbalance", 0, 1e6, &cfg.max_imbalance);
  dbl("--health-interval", 0.05, 3600, &cfg.health_interval_s);
  dbl("--request-timeout", 0.1, 86400, &cfg.timeouts.read_s);
  dbl("--kv-tier-weight", 0, 1, &cfg.kv_tier_weight);
  dbl("--kv-replay-timeout", 0.01, 60, &cfg.kv_replay_timeout_s);
  double threshold = -1;  // < 0: not given
  dbl("--kv-match-threshold", 0, 1, &threshold);
  const bool threshold_given = threshold >= 0;
  if (threshold_given) cfg.kv_match_threshold = threshold;
  double hold = -1;  // < 0: not given
  dbl("--kv-max-imbalance", 0, 1e6, &hold);
  if (hold >= 0) cfg.kv_max_imbalance = hold;
  if (err.empty() && !cfg.kv_events &&
      (!cfg.kv_event_endpoints.empty() || !cfg.kv_replay_endpoints.empty() || kv_min_match > 0 || threshold_given || hold >= 0))
    err = "--kv-events-endpoint, --kv-replay-endpoint, --kv-min-match, --kv-match-threshold and --kv-max-imbalance "
          "need --kv-events";
  if (err.empty()) err = args.leftover();
  if (err.empty() && replicas.empty()) err = "at least one --replica URL is needed";
  cfg.replicas = replicas;
  if (auto code = help_or_usage_error("router", args.help(), err, kRouterHelp)) return *code;

  auto r = router::Router::create(cfg);
  if (!r.ok()) {
    std::fprintf(stderr, "pagoda router: %s\n", r.message().c_str());
    return 1;
  }
  auto port = (*r)->start();
  if (!port.ok()) {
    std::fprintf(stderr, "pagoda router: %s\n", port.message().c_str());
    return 1;
  }
  // The same line as serve's, so scripts find the port the same way.
  PAGODA_LOG_INFO("listening on http://%s:%d (router over %zu replicas)", cfg.http.host.c_str(), *port,
                  cfg.replicas.size());
  std::fflush(stderr);
  router::Router* rt = r->get();
  return run_until_signal([rt] { rt->run(); }, [rt] { rt->stop(); });
}

Register reg("router", "prefix-aware OpenAI-compatible router over several serve replicas", router_main);

}  // namespace
}  // namespace pagoda::cli
