#include "cli/engine_flags.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "base/log.h"
#include "base/log_control.h"
#include "cli/cli_util.h"
#include "cli/command.h"
#include "cli/speculative_flags.h"

namespace pagoda::cli {

namespace {
std::string env_name(const std::string& flag) {
  std::string n = "PAGODA_";
  for (char c : flag.substr(flag.find_first_not_of('-'))) n += c == '-' ? '_' : static_cast<char>(std::toupper(c));
  return n;
}

// True when argument `a` is flag `name` (a `--` flag's underscores read as dashes).
bool is_flag(const std::string& a, const std::string& name) {
  if (a.size() != name.size()) return false;
  if (a.rfind("--", 0) != 0) return a == name;
  for (size_t i = 0; i < a.size(); ++i)
    if ((a[i] == '_' ? '-' : a[i]) != name[i]) return false;
  return true;
}

// True when argument `a` is `name=VALUE` (*value set).
bool is_assignment(const std::string& a, const std::string& name, std::string* value) {
  const size_t eq = a.find('=');
  if (eq == std::string::npos || !is_flag(a.substr(0, eq), name)) return false;
  *value = a.substr(eq + 1);
  return true;
}

bool to_int(const std::string& s, long long lo, long long hi, long long* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno || *end || v < lo || v > hi) return false;
  *out = v;
  return true;
}
}  // namespace

Args::Args(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    if (s == "--help" || s == "-h") { help_ = true; continue; }
    if (s == "--version" || s == "-V") { version_ = true; continue; }
    a_.push_back(s);
  }
  used_.assign(a_.size(), false);
}

bool Args::flag(const std::string& name, const std::string& alias) {
  bool found = false;
  for (size_t i = 0; i < a_.size(); ++i) {
    if (!used_[i] && (is_flag(a_[i], name) || (!alias.empty() && is_flag(a_[i], alias)))) { used_[i] = true; found = true; }
  }
  if (found) return true;
  const char* e = std::getenv(env_name(name).c_str());
  return e && (!std::strcmp(e, "1") || !std::strcmp(e, "true"));
}

bool Args::value(const std::string& name, std::string* out, const std::string& alias) {
  return take(name, alias, nullptr, out);
}

bool Args::optional_value(const std::string& name, const std::string& alias, const std::vector<std::string>& choices,
                          std::string* out) {
  return take(name, alias, &choices, out);
}

bool Args::take(const std::string& name, const std::string& alias, const std::vector<std::string>* choices,
                std::string* out) {
  bool found = false;
  for (size_t i = 0; i < a_.size(); ++i) {
    if (used_[i]) continue;
    for (const std::string& n : {name, alias}) {
      if (n.empty()) continue;
      if (is_assignment(a_[i], n, out)) {
        used_[i] = true;
        found = true;
      } else if (is_flag(a_[i], n) && !choices && i + 1 < a_.size()) {
        used_[i] = used_[i + 1] = true;  // --name VALUE
        *out = a_[i + 1];
        found = true;
      } else if (is_flag(a_[i], n) && choices) {
        // --name alone, or --name CHOICE when the next argument is one of the choices.
        used_[i] = true;
        found = true;
        out->clear();
        for (const auto& c : *choices) {
          if (i + 1 < a_.size() && !used_[i + 1] && a_[i + 1] == c) {
            used_[i + 1] = true;
            *out = c;
          }
        }
      }
    }
  }
  if (found) return true;
  if (const char* e = std::getenv(env_name(name).c_str())) {
    *out = e;
    return true;
  }
  return false;
}

std::vector<std::string> Args::take_all(const std::vector<std::string>& names) {
  std::vector<std::string> out;
  for (size_t i = 0; i < a_.size(); ++i) {
    if (used_[i]) continue;
    for (const std::string& n : names) {
      std::string v;
      if (is_flag(a_[i], n) && i + 1 < a_.size()) {
        used_[i] = used_[i + 1] = true;
        out.push_back(a_[++i]);
        break;
      }
      if (is_assignment(a_[i], n, &v)) {
        used_[i] = true;
        out.push_back(v);
        break;
      }
    }
  }
  return out;
}

std::vector<std::string> Args::values(const std::string& name) { return take_all({name}); }

std::vector<std::string> Args::list(const std::string& name, const std::vector<std::string>& aliases) {
  std::vector<std::string> names = aliases;
  names.insert(names.begin(), name);
  std::vector<std::string> out = take_all(names);
  if (out.empty())
    if (const char* e = std::getenv(env_name(name).c_str())) out.emplace_back(e);
  return out;
}

std::vector<std::string> Args::positionals() {
  std::vector<std::string> out;
  for (size_t i = 0; i < a_.size(); ++i) {
    if (used_[i] || a_[i].empty() || a_[i][0] == '-') continue;
    used_[i] = true;
    out.push_back(a_[i]);
  }
  return out;
}

std::string Args::leftover(bool flags_only) const {
  for (size_t i = 0; i < a_.size(); ++i) {
    if (used_[i]) continue;
    const std::string& s = a_[i];
    if (flags_only && (s.size() < 2 || s[0] != '-')) continue;
    if (s.size() > 1 && s[0] == '-') {
      const std::string name = s.substr(0, s.find('='));
      // A known value flag given last, with nothing after it, is unused too.
      return "unknown flag " + name + " (or a flag missing its value; see --help)";
    }
    return "unexpected argument '" + s + "'";
  }
  return "";
}

bool parse_bytes(const std::string& s, int64_t* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  std::string unit(end);
  double mul = 1;
  if (unit.empty() || unit == "B") mul = 1;
  else if (unit == "KiB" || unit == "K" || unit == "k") mul = 1024.0;
  else if (unit == "MiB" || unit == "M") mul = 1024.0 * 1024;
  else if (unit == "GiB" || unit == "G") mul = 1024.0 * 1024 * 1024;
  else if (unit == "KB") mul = 1e3;
  else if (unit == "MB") mul = 1e6;
  else if (unit == "GB") mul = 1e9;
  else return false;
  if (!(v > 0) || v * mul > 9e18) return false;
  *out = static_cast<int64_t>(v * mul);
  return true;
}

bool parse_kv_dtype_name(const std::string& s, KvDtype* out) {
  if (s == "auto") {
    *out = KvDtype::F16;
    return true;
  }
  return kv_dtype_from_name(s, out);
}

std::string kv_dtype_from_ctk_ctv(const std::string* k, const std::string* v, KvTypes* out) {
  const std::string kn = k ? *k : "f16", vn = v ? *v : "f16";
  KvDtype kd{}, vd{};
  if (!parse_kv_dtype_name(kn, &kd))
    return "bad value '" + kn + "' for -ctk/--cache-type-k (" + kv_dtype_names() + ")";
  if (!parse_kv_dtype_name(vn, &vd))
    return "bad value '" + vn + "' for -ctv/--cache-type-v (" + kv_dtype_names() + ")";
  *out = KvTypes(kd, vd);
  return "";
}

const char* kEngineFlagsHelp =
    "  -m, --model PATH              GGUF model (default: the SmolLM2-135M-Instruct Q4_1 of scripts/setup)\n"
    "  MODEL (positional)            the same as -m MODEL (`pagoda serve MODEL`)\n"
    "  -t, --threads N               compute threads (default: all cores)\n"
    "  -c, --ctx-size N              context length per request (default: the model's); or --max-model-len\n"
    "  --kv-dtype f32|f16|bf16|q8_0  KV cache element type (default f16); or --kv-cache-dtype (vLLM),\n"
    "                                or -ctk T -ctv T (llama.cpp; one type for both)\n"
    "  --block-size N                tokens per KV block, 1..256 (default 16)\n"
    "  --kv-cache-memory BYTES       KV pool size, e.g. 512MiB (default 256MiB)\n"
    "  --num-kv-blocks N             KV pool size in blocks (wins over --kv-cache-memory)\n"
    "  --enable-prefix-caching / --no-enable-prefix-caching   (default on)\n"
    "  --state-checkpoint-interval K   hybrid models (recurrent state, e.g. lfm2): keep a copy of the\n"
    "                                state every K KV blocks so prefix hits restore it (default 4;\n"
    "                                1 = every block; 0 = off: no prefix caching for these models)\n"
    "  --disable-hybrid-kv-cache-manager   every layer keeps a full-context KV table (sliding windows\n"
    "                          only masked); default: window layers hold only their window\n"
    "  --max-num-seqs N              running requests per step (default 64); or -np/--parallel\n"
    "  --max-num-batched-tokens auto|N   token budget per step (default auto: decodes first, then\n"
    "                                prefill up to what keeps the step within --step-time-factor F\n"
    "                                (default 2) x a pure decode step's measured time, at least\n"
    "                                --min-prefill-chunk N (default 64) tokens, at most 2048 in all)\n"
    "  --schedule-policy fcfs|lpm    admission order: arrival, or longest cached prefix first (default fcfs)\n"
    "  --scheduling-policy fcfs|priority   vLLM's: priority admits the request field priority lowest\n"
    "                                first and preempts the worst (default fcfs)\n"
    "  --kv-pinned-fraction F        pinned prefixes (cache_control, prompt_cache_retention) hold at\n"
    "                                most F of the KV blocks; past it the oldest pin is demoted (default 0.2)\n"
    "  --gpu-memory-utilization F    fraction of RAM for weights + KV cache: the KV pool gets\n"
    "                                F x RAM minus the model file (vLLM's flag; CPU meaning)\n"
    "  accepted and ignored, with a warning (pagoda runs on the CPU): -ngl/--n-gpu-layers N,\n"
    "    -fa/--flash-attn [on|off|auto], --enforce-eager, --dtype T, --tensor-parallel-size 1\n"
    "    (-tp; other sizes are an error), --pipeline-parallel-size 1, --swap-space N,\n"
    "    --trust-remote-code, --no-mmap, --mlock; -cb/--cont-batching and --jinja are always on\n"
    "  --kv-disk-dir DIR             KV tier on disk below the RAM prefix cache (survives restarts)\n"
    "  --kv-disk-size BYTES          what the disk tier may hold, least recently used out (default 4GiB)\n"
    "  --kv-disk-fsync on|off        fsync each disk entry before its rename (default on: crash-durable)\n"
    "  --kv-redis redis://HOST:PORT[,HOST:PORT...]   KV tier in Redis or a Redis Cluster, shared by replicas\n"
    "  --kv-redis-ttl SECONDS        TTL of the Redis entries (default 0: none, Redis's maxmemory policy evicts)\n"
    "  --kv-tier-secret S            the deployment's secret for tier entries (at least 16 bytes; the same on\n"
    "                                every replica): keyed names, encrypted K/V, a MAC (or PAGODA_KV_TIER_SECRET)\n"
    "  --kv-tier-secret-file FILE    the secret from a file (one trailing newline dropped)\n"
    "  --kv-events-config JSON       publish KV cache events over ZeroMQ (vLLM's keys: enable_kv_cache_events,\n"
    "                                publisher zmq|null, endpoint, replay_endpoint, topic, buffer_steps, hwm)\n"
    PAGODA_SPECULATIVE_FLAGS_HELP;  // speculative_flags.h

const char* kLogFlagsHelp =
    "  --log-level debug|info|warn|error|off   (default info; or PAGODA_LOG_LEVEL)\n"
    "  -v, --verbose                 the same as --log-level debug\n";

std::string parse_log_flags(Args& args) {
  std::string v;
  if (args.flag("--verbose", "-v")) set_log_level(LogLevel::kDebug);
  if (args.value("--log-level", &v)) {
    LogLevel l{};
    if (!parse_log_level(v, &l)) return "--log-level must be debug, info, warn, error or off, got '" + v + "'";
    set_log_level(l);
  }
  return "";
}

// vLLM's and llama.cpp's GPU flags: the ones without a CPU meaning are accepted
// (copied launch commands work) and each says once that it changes nothing.
std::string parse_gpu_flags(Args& args) {
  std::string v;
  long long n = 0;
  auto ignored = [](const std::string& flag, const std::string& value) {
    PAGODA_LOG_WARN("%s%s%s: pagoda runs on the CPU; the flag is accepted and ignored", flag.c_str(),
                    value.empty() ? "" : " ", value.c_str());
  };
  if (args.value("--n-gpu-layers", &v, "-ngl") || args.value("--gpu-layers", &v)) {
    if (!to_int(v, -1, 1 << 20, &n)) return "-ngl/--n-gpu-layers must be a layer count, got '" + v + "'";
    ignored("-ngl", v);
  }
  if (args.optional_value("--flash-attn", "-fa", {"on", "off", "auto", "1", "0", "true", "false"}, &v)) {
    if (!v.empty() && v != "on" && v != "off" && v != "auto" && v != "1" && v != "0" && v != "true" && v != "false")
      return "-fa/--flash-attn takes on, off or auto, got '" + v + "'";
    ignored("-fa", v);  // attention is always the paged kernel
  }
  if (args.flag("--enforce-eager")) ignored("--enforce-eager", "");
  if (args.value("--dtype", &v)) {
    static const char* kDtypes[] = {"auto", "half", "float16", "bfloat16", "float", "float32"};
    bool ok = false;
    for (const char* d : kDtypes) ok = ok || v == d;
    if (!ok) return "--dtype must be auto, half, float16, bfloat16, float or float32, got '" + v + "'";
    if (v != "auto") ignored("--dtype", v + " (weights keep their GGUF types)");
  }
  for (const char* name : {"--tensor-parallel-size", "--pipeline-parallel-size"}) {
    const std::string alias = name[2] == 't' ? "-tp" : "-pp";
    if (args.value(name, &v, alias)) {
      if (!to_int(v, 1, 1 << 20, &n)) return std::string(name) + " must be a positive integer, got '" + v + "'";
      if (n != 1) return std::string(name) + " " + v + ": pagoda runs one process on one CPU socket; only 1 is supported";
    }
  }
  if (args.value("--swap-space", &v)) ignored("--swap-space", v);
  for (const char* f : {"--trust-remote-code", "--no-mmap", "--mlock"})
    if (args.flag(f)) ignored(f, "");
  args.flag("--cont-batching", "-cb");  // always on
  args.flag("--jinja");                 // chat templates are always Jinja
  return "";
}

namespace {
int64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
}
}  // namespace

std::string finish_engine_flags(Args& args, engine::EngineConfig* cfg) {
  // An unknown flag first: `--x 3` should name --x, not call 3 a second model.
  if (std::string err = args.leftover(/*flags_only=*/true); !err.empty()) return err;
  const std::vector<std::string> pos = args.positionals();
  if (pos.size() > 1) return "unexpected argument '" + pos[1] + "' (one model path at most)";
  if (!pos.empty()) cfg->model_path = pos[0];
  if (std::string err = args.leftover(); !err.empty()) return err;
  if (args.gpu_memory_utilization > 0 && !args.kv_size_given) {
    std::error_code ec;
    const auto weights = static_cast<int64_t>(std::filesystem::file_size(cfg->model_path, ec));
    if (ec) return "--gpu-memory-utilization: cannot size the model file " + cfg->model_path + ": " + ec.message();
    const int64_t ram = physical_memory_bytes();
    const auto budget = static_cast<int64_t>(args.gpu_memory_utilization * static_cast<double>(ram)) - weights;
    if (budget <= 0)
      return "--gpu-memory-utilization " + std::to_string(args.gpu_memory_utilization) + " of " +
             human_bytes(static_cast<double>(ram)) + " RAM leaves nothing for the KV cache after the " +
             human_bytes(static_cast<double>(weights)) + " model";
    cfg->kv_cache_memory = budget;
    PAGODA_LOG_INFO("--gpu-memory-utilization %.3g: %s of %s RAM for weights (%s) + KV cache (%s)",
                    args.gpu_memory_utilization, human_bytes(args.gpu_memory_utilization * static_cast<double>(ram)).c_str(),
                    human_bytes(static_cast<double>(ram)).c_str(), human_bytes(static_cast<double>(weights)).c_str(),
                    human_bytes(static_cast<double>(budget)).c_str());
  }
  return "";
}

std::string parse_engine_flags(Args& args, engine::EngineConfig* cfg) {
  std::string v;
  long long n = 0;
  cfg->model_path = default_model_path();
  cfg->threads = threads_or_all(0);  // every core, as `run` (llama.cpp and vLLM use them all)
  if (args.value("--model", &v, "-m")) cfg->model_path = v;
  if (args.value("--threads", &v, "-t")) {
    if (!to_int(v, 1, 256, &n)) return "--threads must be an integer in 1..256, got '" + v + "'";
    cfg->threads = static_cast<int>(n);
  }
  if (args.value("--ctx-size", &v, "-c") || args.value("--max-model-len", &v)) {
    if (!to_int(v, 1, 1 << 24, &n)) return "--ctx-size must be a positive integer, got '" + v + "'";
    cfg->context_length = static_cast<int>(n);
  }
  // --kv-dtype or vLLM's --kv-cache-dtype (wins), else llama.cpp's -ctk / -ctv.
  KvTypes kv{};
  bool have_kv = false;
  std::string k_name, v_name;
  const bool have_k = args.value("--cache-type-k", &k_name, "-ctk");
  const bool have_v = args.value("--cache-type-v", &v_name, "-ctv");
  if (have_k || have_v) {
    const std::string err = kv_dtype_from_ctk_ctv(have_k ? &k_name : nullptr, have_v ? &v_name : nullptr, &kv);
    if (!err.empty()) return err;
    have_kv = true;
  }
  if (args.value("--kv-dtype", &v, "--kv-cache-dtype")) {
    KvDtype both{};
    if (!parse_kv_dtype_name(v, &both))
      return "--kv-dtype/--kv-cache-dtype must be one of " + std::string(kv_dtype_names()) + " or auto, got '" + v + "'";
    kv = both;
    have_kv = true;
  }
  if (have_kv) cfg->kv_dtype = kv;
  if (args.value("--block-size", &v)) {
    if (!to_int(v, 1, 256, &n)) return "--block-size must be an integer in 1..256, got '" + v + "'";
    cfg->block_size = static_cast<int>(n);
  }
  if (args.value("--kv-cache-memory", &v)) {
    int64_t b = 0;
    if (!parse_bytes(v, &b)) return "--kv-cache-memory must be a byte size like 536870912 or 512MiB, got '" + v + "'";
    cfg->kv_cache_memory = b;
    args.kv_size_given = true;
  }
  if (args.value("--num-kv-blocks", &v)) {
    if (!to_int(v, 2, 1 << 30, &n)) return "--num-kv-blocks must be an integer >= 2, got '" + v + "'";
    cfg->num_kv_blocks = static_cast<int>(n);
    args.kv_size_given = true;
  }
  if (args.value("--gpu-memory-utilization", &v)) {
    double f = 0;
    if (!parse_f64(v, &f) || !(f > 0 && f <= 1)) return "--gpu-memory-utilization must be in (0, 1], got '" + v + "'";
    args.gpu_memory_utilization = f;
  }
  if (std::string err = parse_gpu_flags(args); !err.empty()) return err;
  if (args.flag("--no-enable-prefix-caching")) cfg->enable_prefix_caching = false;
  if (args.flag("--enable-prefix-caching")) cfg->enable_prefix_caching = true;
  if (args.flag("--disable-hybrid-kv-cache-manager")) cfg->disable_hybrid_kv_cache_manager = true;
  if (args.value("--state-checkpoint-interval", &v)) {
    if (!to_int(v, 0, 1 << 20, &n))
      return "--state-checkpoint-interval must be an integer in 0..1048576 (KV blocks between state checkpoints; 0: off), "
             "got '" + v + "'";
    cfg->state_checkpoint_interval = static_cast<int>(n);
  }
  if (args.value("--max-num-seqs", &v, "-np") || args.value("--parallel", &v)) {
    if (!to_int(v, 1, 4096, &n)) return "--max-num-seqs must be an integer in 1..4096, got '" + v + "'";
    cfg->max_num_seqs = static_cast<int>(n);
  }
  cfg->auto_batched_tokens = true;  // the default: the step budget follows the measured step times
  if (args.value("--max-num-batched-tokens", &v)) {
    if (v != "auto") {
      if (!to_int(v, 1, 1 << 20, &n))
        return "--max-num-batched-tokens must be auto or a positive integer, got '" + v + "'";
      cfg->max_num_batched_tokens = static_cast<int>(n);
      cfg->auto_batched_tokens = false;
    }
  }
  if (args.value("--step-time-factor", &v)) {
    double f = 0;
    if (!parse_f64(v, &f) || !(f >= 1 && f <= 100)) return "--step-time-factor must be a number in 1..100, got '" + v + "'";
    cfg->auto_step_factor = f;
  }
  if (args.value("--min-prefill-chunk", &v)) {
    if (!to_int(v, 1, 1 << 20, &n)) return "--min-prefill-chunk must be a positive integer, got '" + v + "'";
    cfg->auto_min_prefill_tokens = static_cast<int>(n);
  }
  if (args.value("--schedule-policy", &v)) {
    if (v == "fcfs") cfg->schedule_lpm = false;
    else if (v == "lpm") cfg->schedule_lpm = true;
    else return "--schedule-policy must be fcfs or lpm, got '" + v + "'";
  }
  if (args.value("--scheduling-policy", &v)) {
    if (v != "fcfs" && v != "priority") return "--scheduling-policy must be fcfs or priority, got '" + v + "'";
    cfg->scheduling_policy = v;
  }
  if (args.value("--kv-pinned-fraction", &v)) {
    double f = 0;
    if (!parse_f64(v, &f) || !(f >= 0 && f <= 1)) return "--kv-pinned-fraction must be a number in [0, 1], got '" + v + "'";
    cfg->kv_pinned_fraction = f;
  }
  if (args.value("--kv-disk-dir", &v)) {
    if (v.empty()) return "--kv-disk-dir needs a directory";
    cfg->kv_disk_dir = v;
    if (cfg->kv_disk_size <= 0) cfg->kv_disk_size = int64_t{4} << 30;
  }
  if (args.value("--kv-disk-size", &v)) {
    int64_t b = 0;
    if (!parse_bytes(v, &b) || b <= 0) return "--kv-disk-size must be a positive byte size like 4GiB, got '" + v + "'";
    cfg->kv_disk_size = b;
  }
  if (args.value("--kv-disk-fsync", &v)) {
    if (v != "on" && v != "off") return "--kv-disk-fsync must be on or off, got '" + v + "'";
    cfg->kv_disk_fsync = v == "on";
  }
  if (args.value("--kv-redis", &v)) {
    if (v.empty()) return "--kv-redis needs redis://HOST:PORT[,HOST:PORT...]";
    cfg->kv_redis = v;
  }
  if (args.value("--kv-redis-ttl", &v)) {
    if (!to_int(v, 0, 2147483647, &n)) return "--kv-redis-ttl must be a number of seconds >= 0, got '" + v + "'";
    cfg->kv_redis_ttl = static_cast<int>(n);
  }
  if (args.value("--kv-tier-secret", &v)) cfg->kv_tier_secret = v;
  if (args.value("--kv-events-config", &v)) {  // checked (and a bad one refused) when the engine starts
    if (v.empty()) return "--kv-events-config needs a JSON object";
    cfg->kv_events_config = v;
  }
  if (args.value("--kv-tier-secret-file", &v)) {
    std::string secret;
    if (!read_file(v, &secret)) return "--kv-tier-secret-file: cannot read " + v;
    if (!secret.empty() && secret.back() == '\n') secret.pop_back();
    if (!secret.empty() && secret.back() == '\r') secret.pop_back();
    cfg->kv_tier_secret = secret;
  }
  if (!cfg->kv_tier_secret.empty() && cfg->kv_tier_secret.size() < 16)
    return "--kv-tier-secret must be at least 16 bytes, got " + std::to_string(cfg->kv_tier_secret.size());
  if (std::string e = parse_speculative_flags(args, &cfg->speculative); !e.empty()) return e;  // speculative_flags.*
  return "";
}

}  // namespace pagoda::cli
