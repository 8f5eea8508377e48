// llama-bench's command line and output formats for `pagoda bench` (single stream).
// The field lists, widths and number formats follow llama.cpp's tools/llama-bench so
// that scripts written for its md/csv/json/jsonl output read ours unchanged.
#include "cli/bench_llama.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <numeric>
#include <sstream>

#include "cli/cli_util.h"
#include "cli/engine_flags.h"
#include "loadgen/read_bandwidth.h"

namespace pagoda::cli::llb {

namespace {

// Digits at s[*i...] into *v; false when there are none or they overflow.
bool take_uint(const std::string& s, size_t* i, int64_t* v) {
  const size_t start = *i;
  int64_t n = 0;
  while (*i < s.size() && s[*i] >= '0' && s[*i] <= '9') {
    if (n > (INT64_MAX - 9) / 10) return false;
    n = n * 10 + (s[*i] - '0');
    ++*i;
  }
  *v = n;
  return *i > start;
}

std::vector<std::string> split(const std::string& s, char delim) {
  std::vector<std::string> out;
  size_t b = 0;
  for (;;) {
    const size_t e = s.find(delim, b);
    out.push_back(s.substr(b, e == std::string::npos ? std::string::npos : e - b));
    if (e == std::string::npos) return out;
    b = e + 1;
  }
}

}  // namespace

std::string parse_int_range(const std::string& s, std::vector<int64_t>* out) {
  std::vector<int64_t> got;
  for (const std::string& item : split(s, ',')) {
    size_t i = 0;
    int64_t first = 0, last = 0, step = 1;
    char op = '+';
    if (!take_uint(item, &i, &first)) return "'" + s + "' is not a list of integers (first[-last[+step|*mult]],...)";
    last = first;
    if (i < item.size() && item[i] == '-') {
      ++i;
      if (!take_uint(item, &i, &last)) return "'" + s + "': a range needs its last value";
      if (i < item.size() && (item[i] == '+' || item[i] == '*')) {
        op = item[i++];
        if (!take_uint(item, &i, &step)) return "'" + s + "': a range step needs a value";
      }
    }
    if (i != item.size()) return "'" + s + "' is not a list of integers (first[-last[+step|*mult]],...)";
    if (last < first) return "'" + s + "': range " + item + " ends before it starts";
    for (int64_t v = first; v <= last;) {
      got.push_back(v);
      if (got.size() > 100000) return "'" + s + "' expands to too many values";
      const int64_t next = op == '+' ? v + step : v * step;
      if (next <= v) return "'" + s + "': range " + item + " does not advance";
      v = next;
    }
  }
  out->insert(out->end(), got.begin(), got.end());
  return "";
}

std::string parse_options(int argc, char** argv, const std::string& default_model, int64_t default_threads,
                          Options* o, bool* help) {
  // The one parser of every subcommand (cli::Args): --name=VALUE, --n_prompt as
  // --n-prompt, PAGODA_<NAME> for a flag not given (PAGODA_N_PROMPT=128,512), and an
  // unknown flag named in the error. List flags keep llama-bench's syntax: each
  // value a comma list or range, the flag repeatable, values in command-line order.
  Args args(argc, argv);
  if (args.help()) {
    *help = true;
    return "";
  }
  // Switches without a value.
  o->legacy_json = args.flag("--json") || o->legacy_json;
  o->ctx_sweep = args.flag("--ctx-sweep") || o->ctx_sweep;
  o->progress = args.flag("--progress") || o->progress;
  if (args.flag("--no-bandwidth")) o->bandwidth = false;
  if (args.flag("--no-warmup")) o->warmup = false;
  struct ListFlag {
    const char* name;  // the long name: PAGODA_<NAME> in the environment
    std::vector<std::string> aliases;
    std::vector<int64_t> Options::*field;
    int64_t lo, hi;
  };
  const ListFlag kLists[] = {{"--n-prompt", {"-p", "--pp"}, &Options::n_prompt, 0, 1 << 20},
                             {"--n-gen", {"-n", "--tg"}, &Options::n_gen, 0, 1 << 20},
                             {"--threads", {"-t"}, &Options::n_threads, 1, 1024},
                             {"--batch-size", {"-b"}, &Options::n_batch, 1, 1 << 20},
                             {"--ubatch-size", {"-ub"}, &Options::n_ubatch, 1, 1 << 20},
                             {"--n-depth", {"-d"}, &Options::n_depth, 0, 1 << 20}};
  for (const ListFlag& f : kLists) {
    const std::string shown = f.aliases[0];  // llama-bench's short name, in errors
    for (const std::string& v : args.list(f.name, f.aliases)) {
      std::vector<int64_t> vals;
      if (std::string e = parse_int_range(v, &vals); !e.empty()) return shown + ": " + e;
      for (int64_t x : vals)
        if (x < f.lo || x > f.hi)
          return shown + ": " + std::to_string(x) + " is out of range " + std::to_string(f.lo) + ".." +
                 std::to_string(f.hi);
      (o->*f.field).insert((o->*f.field).end(), vals.begin(), vals.end());
    }
  }
  for (const std::string& v : args.list("--model", {"-m"}))
    for (const std::string& m : split(v, ','))
      if (!m.empty()) o->models.push_back(m);
  for (const std::string& v : args.list("-pg")) {
    const std::vector<std::string> p = split(v, ',');
    int64_t pp = 0, tg = 0;
    if (p.size() != 2 || !parse_int(p[0], 0, 1 << 20, &pp) || !parse_int(p[1], 0, 1 << 20, &tg))
      return "-pg wants PP,TG (two integers), got '" + v + "'";
    o->n_pg.emplace_back(pp, tg);
  }
  std::string v;
  auto bad = [&v](const char* flag) { return "bad value '" + v + "' for " + flag; };
  if (args.value("--repetitions", &v, "-r") || args.value("--reps", &v))
    if (!parse_int(v, 1, 1000, &o->reps)) return bad("-r");
  bool format_given = false;
  if (args.value("--output", &v, "-o")) {
    format_given = true;
    if (v == "md") o->format = Format::kMarkdown;
    else if (v == "csv") o->format = Format::kCsv;
    else if (v == "json") o->format = Format::kJson;
    else if (v == "jsonl") o->format = Format::kJsonl;
    else return "-o must be md, csv, json or jsonl, got '" + v + "'";
  }
  if (args.value("--block-size", &v) && !parse_int(v, 1, 4096, &o->block_size)) return bad("--block-size");
  if (args.value("--state-checkpoint-interval", &v) && !parse_int(v, 0, 1 << 20, &o->state_checkpoint_interval))
    return bad("--state-checkpoint-interval");
  if (args.value("--seed", &v) && !parse_int(v, INT64_MIN, INT64_MAX, &o->seed)) return bad("--seed");
  // llama-bench's GPU options (each a list there): accepted, they change nothing on a CPU.
  for (const auto& [name, alias] : std::vector<std::pair<std::string, std::string>>{
           {"--n-gpu-layers", "-ngl"}, {"--flash-attn", "-fa"}, {"--no-kv-offload", "-nkvo"}, {"--mmap", "-mmp"}})
    for (const std::string& g : args.list(name, {alias}))
      o->warnings.push_back(alias + " " + g + " ignored: pagoda runs on the CPU");
  if (std::string err = read_kv_dtype_flags(args, &o->kv_dtype); !err.empty()) return err;
  if (args.value("--gpu-memory-utilization", &v))  // a pool for many requests: the serving mode's
    return "--gpu-memory-utilization sizes the KV pool of a serving run (--workload, --dataset-name); the "
           "single-stream tests hold one sequence of their own context, as llama-bench";
  if (std::string err = args.leftover(/*flags_only=*/true); !err.empty()) return err;
  // `pagoda bench MODEL...`: positional models, as -m; they replace a PAGODA_MODEL list
  // (the environment gives a flag that the command line does not).
  const std::vector<std::string> pos = args.positionals();
  if (const char* env = std::getenv("PAGODA_MODEL"); env && !pos.empty() && o->models == split(env, ','))
    o->models.clear();
  o->models.insert(o->models.end(), pos.begin(), pos.end());
  if (std::string err = args.leftover(); !err.empty()) return err;
  if (o->legacy_json && format_given) return "give --json or -o, not both";
  if (o->models.empty()) o->models.push_back(default_model);
  if (o->n_prompt.empty()) o->n_prompt.push_back(kDefaultPrompt);
  if (o->n_gen.empty()) o->n_gen.push_back(kDefaultGen);
  if (o->n_threads.empty()) o->n_threads.push_back(default_threads);
  if (o->n_batch.empty()) o->n_batch.push_back(kDefaultBatch);
  if (o->n_ubatch.empty()) o->n_ubatch.push_back(kDefaultUbatch);
  if (o->n_depth.empty()) o->n_depth.push_back(0);
  if (o->legacy_json) {
    auto nonzero = [](const std::vector<int64_t>& v) { return std::count_if(v.begin(), v.end(), [](int64_t x) { return x > 0; }); };
    if (o->models.size() > 1 || o->n_threads.size() > 1 || o->n_batch.size() > 1 || o->n_ubatch.size() > 1 ||
        o->n_depth.size() > 1 || o->n_depth[0] != 0 ||
        nonzero(o->n_prompt) > 1 || nonzero(o->n_gen) > 1 || !o->n_pg.empty())
      return "--json describes one model, one thread count, one pp and one tg test; use -o json or -o jsonl for lists";
  }
  if (o->ctx_sweep && std::any_of(o->n_depth.begin(), o->n_depth.end(), [](int64_t d) { return d > 0; }))
    return "give -d or --ctx-sweep, not both (-d turns the prefix cache on, which the sweep's recompute must not hit)";
  if (instances(*o).empty()) return "nothing to run: every -p, -n and -pg value is 0";
  return "";
}

std::vector<Instance> instances(const Options& o) {
  std::vector<Instance> out;
  for (const std::string& m : o.models)
    for (int64_t nb : o.n_batch)
      for (int64_t nub : o.n_ubatch)
        for (int64_t nt : o.n_threads)
          for (int64_t nd : o.n_depth) {
            const Instance base{m, 0, 0, nb, nub, nt, nd};
            for (int64_t p : o.n_prompt) {
              if (p == 0) continue;
              Instance i = base;
              i.n_prompt = p;
              out.push_back(i);
            }
            for (int64_t g : o.n_gen) {
              if (g == 0) continue;
              Instance i = base;
              i.n_gen = g;
              out.push_back(i);
            }
            for (const auto& [p, g] : o.n_pg) {
              if (p == 0 && g == 0) continue;
              Instance i = base;
              i.n_prompt = p;
              i.n_gen = g;
              out.push_back(i);
            }
          }
  return out;
}

std::string test_name(int64_t n_prompt, int64_t n_gen, int64_t n_depth) {
  std::string t = n_gen == 0     ? "pp" + std::to_string(n_prompt)
                  : n_prompt == 0 ? "tg" + std::to_string(n_gen)
                                  : "pp" + std::to_string(n_prompt) + "+tg" + std::to_string(n_gen);
  return n_depth > 0 ? t + " @ d" + std::to_string(n_depth) : t;
}

// ---- Statistics, as llama-bench computes them ---------------------------------

namespace {

double mean(const std::vector<double>& v) {
  return v.empty() ? 0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

// The sample standard deviation (n - 1); 0 for fewer than two samples.
double stdev(const std::vector<double>& v) {
  if (v.size() <= 1) return 0;
  const double m = mean(v);
  double sq = 0;
  for (double x : v) sq += (x - m) * (x - m);
  return std::sqrt(sq / static_cast<double>(v.size() - 1));
}

std::vector<double> as_double(const std::vector<uint64_t>& v) { return {v.begin(), v.end()}; }

}  // namespace

double Result::avg_ns() const { return mean(as_double(samples_ns)); }
double Result::stddev_ns() const { return stdev(as_double(samples_ns)); }
std::vector<double> Result::samples_ts() const {
  std::vector<double> ts;
  const double n = static_cast<double>(inst.n_prompt + inst.n_gen);
  for (uint64_t ns : samples_ns) ts.push_back(ns > 0 ? 1e9 * n / static_cast<double>(ns) : 0.0);
  return ts;
}
double Result::avg_ts() const { return mean(samples_ts()); }
double Result::stddev_ts() const { return stdev(samples_ts()); }
double Result::weight_gb_per_s() const {
  if (inst.n_prompt != 0 || inst.n_gen == 0) return 0;
  return avg_ts() * static_cast<double>(weight_bytes_per_token) / 1e9;
}
double Result::read_bw_fraction() const { return read_gb_per_s > 0 ? weight_gb_per_s() / read_gb_per_s : 0; }

// ---- Fields ------------------------------------------------------------------

namespace {

enum class Kind { kString, kBool, kInt, kFloat };

// llama-bench's test::get_fields(), then pagoda's.
const std::vector<std::pair<std::string, Kind>>& typed_fields() {
  static const std::vector<std::pair<std::string, Kind>> f = {
      {"build_commit", Kind::kString},   {"build_number", Kind::kInt},       {"cpu_info", Kind::kString},
      {"gpu_info", Kind::kString},       {"backends", Kind::kString},        {"model_filename", Kind::kString},
      {"model_type", Kind::kString},     {"model_size", Kind::kInt},         {"model_n_params", Kind::kInt},
      {"n_batch", Kind::kInt},           {"n_ubatch", Kind::kInt},           {"n_threads", Kind::kInt},
      {"cpu_mask", Kind::kString},       {"cpu_strict", Kind::kBool},        {"poll", Kind::kInt},
      {"type_k", Kind::kString},         {"type_v", Kind::kString},          {"n_gpu_layers", Kind::kInt},
      {"n_cpu_moe", Kind::kInt},         {"split_mode", Kind::kString},      {"main_gpu", Kind::kInt},
      {"no_kv_offload", Kind::kBool},    {"flash_attn", Kind::kInt},         {"devices", Kind::kString},
      {"tensor_split", Kind::kString},   {"tensor_buft_overrides", Kind::kString},
      {"load_mode", Kind::kString},      {"lazy_mode", Kind::kString},       {"embeddings", Kind::kBool},
      {"no_op_offload", Kind::kInt},     {"no_host", Kind::kBool},           {"repack", Kind::kBool},
      {"fit_target", Kind::kInt},        {"fit_min_ctx", Kind::kInt},        {"n_prompt", Kind::kInt},
      {"n_gen", Kind::kInt},             {"n_depth", Kind::kInt},            {"test_time", Kind::kString},
      {"avg_ns", Kind::kInt},            {"stddev_ns", Kind::kInt},          {"avg_ts", Kind::kFloat},
      {"stddev_ts", Kind::kFloat},
      // pagoda's: weight bytes read per decoded token, what tg reached, the machine's
      // read bandwidth at these threads and the fraction; the greedy tokens' hash.
      {"weight_bytes_per_token", Kind::kInt}, {"weight_gb_per_s", Kind::kFloat},
      {"read_gb_per_s", Kind::kFloat},   {"read_bw_fraction", Kind::kFloat}, {"tokens_hash", Kind::kString},
      {"tokens_consistent", Kind::kBool},
  };
  return f;
}

// std::to_string's "%f", as llama-bench prints its floats.
std::string fixed6(double d) { return std::to_string(d); }

std::string u64(double d) { return std::to_string(static_cast<uint64_t>(std::llround(std::max(0.0, d)))); }

std::vector<std::string> values(const Result& r, const std::string& build_commit) {
  const Instance& i = r.inst;
  const std::string cpu = loadgen::cpu_model_name();
  return {build_commit, "0", cpu, "", "CPU", r.model.filename, r.model.type, std::to_string(r.model.size),
          std::to_string(r.model.n_params), std::to_string(i.n_batch), std::to_string(i.n_ubatch),
          std::to_string(i.n_threads), "0x0", "0", "50", r.type_k, r.type_v, "0", "0", "none", "0", "0", "0",
          "none", "0.00", "none", "auto", "auto", "0", "0", "0", "0", "0", "0", std::to_string(i.n_prompt),
          std::to_string(i.n_gen), std::to_string(i.n_depth), r.test_time, u64(r.avg_ns()), u64(r.stddev_ns()), fixed6(r.avg_ts()),
          fixed6(r.stddev_ts()), std::to_string(r.weight_bytes_per_token), fixed6(r.weight_gb_per_s()),
          fixed6(r.read_gb_per_s), fixed6(r.read_bw_fraction()), r.tokens_hash, r.tokens_consistent ? "1" : "0"};
}

std::string escape_json(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"') o += "\\\"";
    else if (c == '\\') o += "\\\\";
    else if (static_cast<unsigned char>(c) <= 0x1f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      o += b;
    } else o += c;
  }
  return o;
}

std::string json_value(Kind k, const std::string& v) {
  switch (k) {
    case Kind::kString: return "\"" + escape_json(v) + "\"";
    case Kind::kBool: return v == "0" ? "false" : "true";
    default: return v;
  }
}

template <class T>
std::string join(const std::vector<T>& v, const char* sep) {
  std::ostringstream s;
  for (size_t i = 0; i < v.size(); ++i) s << (i ? sep : "") << v[i];
  return s.str();
}

// Every field "name": value, then the samples, as llama-bench's json printers do.
std::string json_object(const Result& r, const std::string& build_commit, bool pretty) {
  const auto& f = typed_fields();
  const std::vector<std::string> v = values(r, build_commit);
  const std::string ind = pretty ? "    " : "", nl = pretty ? "\n" : " ";
  std::string o = pretty ? "  {\n" : "{";
  // llama-bench's fields, the samples, then pagoda's fields.
  const size_t n_llama = f.size() - 6;
  for (size_t i = 0; i < n_llama; ++i) o += ind + "\"" + f[i].first + "\": " + json_value(f[i].second, v[i]) + "," + nl;
  o += ind + "\"samples_ns\": [ " + join(r.samples_ns, ", ") + " ]," + nl;
  o += ind + "\"samples_ts\": [ " + join(r.samples_ts(), ", ") + " ]";
  for (size_t i = n_llama; i < f.size(); ++i) o += "," + nl + ind + "\"" + f[i].first + "\": " + json_value(f[i].second, v[i]);
  o += pretty ? "\n  }" : "}";
  return o;
}

std::string csv_escape(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"') o += '"';
    o += c;
  }
  return o + "\"";
}

std::string human_size(uint64_t b) {
  char buf[32];
  if (b < 1024ull * 1024 * 1024) std::snprintf(buf, sizeof buf, "%.2f MiB", b / 1024.0 / 1024.0);
  else std::snprintf(buf, sizeof buf, "%.2f GiB", b / 1024.0 / 1024.0 / 1024.0);
  return buf;
}

std::string human_params(uint64_t n) {
  char buf[32];
  if (n < 1000ull * 1000 * 1000) std::snprintf(buf, sizeof buf, "%.2f M", n / 1e6);
  else std::snprintf(buf, sizeof buf, "%.2f B", n / 1e9);
  return buf;
}

std::string markdown(const std::vector<Result>& results, const Options& o, const std::string& build_commit) {
  struct Col {
    std::string name;  // header
    int width;         // llama-bench's: negative = left aligned
  };
  std::vector<Col> cols = {{"model", -30}, {"size", 10}, {"params", 10}, {"backend", -10}, {"threads", 7}};
  const bool show_nb = o.n_batch.size() > 1 || o.n_batch[0] != kDefaultBatch;
  const bool show_nub = o.n_ubatch.size() > 1 || o.n_ubatch[0] != kDefaultUbatch;
  const bool show_kv = o.kv_dtype != KvTypes(KvDtype::F16);
  if (show_nb) cols.push_back({"n_batch", 7});
  if (show_nub) cols.push_back({"n_ubatch", 8});
  if (show_kv) {
    cols.push_back({"type_k", 6});
    cols.push_back({"type_v", 6});
  }
  cols.push_back({"test", 15});
  cols.push_back({"t/s", 20});
  // pagoda's column: decode's weight reads as a share of what the machine reads.
  const bool show_bw = std::any_of(results.begin(), results.end(), [](const Result& r) { return r.read_bw_fraction() > 0; });
  if (show_bw) cols.push_back({"% read bw", 9});

  std::string out = "|";
  char buf[256];
  for (const Col& c : cols) {
    std::snprintf(buf, sizeof buf, " %*s |", c.width, c.name.c_str());
    out += buf;
  }
  out += "\n|";
  for (const Col& c : cols) out += " " + std::string(std::abs(c.width) - 1, '-') + (c.width > 0 ? ":" : "-") + " |";
  out += "\n";
  for (const Result& r : results) {
    out += "|";
    for (const Col& c : cols) {
      std::string v;
      int width = c.width;
      if (c.name == "model") v = r.model.type;
      else if (c.name == "size") v = human_size(r.model.size);
      else if (c.name == "params") v = human_params(r.model.n_params);
      else if (c.name == "backend") v = "CPU";
      else if (c.name == "threads") v = std::to_string(r.inst.n_threads);
      else if (c.name == "n_batch") v = std::to_string(r.inst.n_batch);
      else if (c.name == "n_ubatch") v = std::to_string(r.inst.n_ubatch);
      else if (c.name == "type_k") v = r.type_k;
      else if (c.name == "type_v") v = r.type_v;
      else if (c.name == "test") v = test_name(r.inst.n_prompt, r.inst.n_gen, r.inst.n_depth);
      else if (c.name == "t/s") {
        std::snprintf(buf, sizeof buf, "%.2f \xC2\xB1 %.2f", r.avg_ts(), r.stddev_ts());
        v = buf;
        width += 1;  // the UTF-8 '±' is two bytes for one column, as llama-bench pads it
      } else if (c.name == "% read bw" && r.read_bw_fraction() > 0) {
        std::snprintf(buf, sizeof buf, "%.0f %%", 100 * r.read_bw_fraction());
        v = buf;
      }
      std::snprintf(buf, sizeof buf, " %*s |", width, v.c_str());
      out += buf;
    }
    out += "\n";
  }
  out += "\nbuild: " + build_commit + " (0)\n";
  return out;
}

}  // namespace

const std::vector<std::string>& fields() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const auto& [name, kind] : typed_fields()) n.push_back(name);
    return n;
  }();
  return names;
}

std::string format_results(const std::vector<Result>& results, const Options& o, Format format,
                           const std::string& build_commit) {
  std::string out;
  switch (format) {
    case Format::kMarkdown:
      return markdown(results, o, build_commit);
    case Format::kCsv:
      out = join(fields(), ",") + "\n";
      for (const Result& r : results) {
        std::vector<std::string> v = values(r, build_commit);
        for (std::string& s : v) s = csv_escape(s);
        out += join(v, ",") + "\n";
      }
      return out;
    case Format::kJson:
      out = "[\n";
      for (size_t i = 0; i < results.size(); ++i) out += (i ? ",\n" : "") + json_object(results[i], build_commit, true);
      return out + "\n]\n";
    case Format::kJsonl:
      for (const Result& r : results) out += json_object(r, build_commit, false) + "\n";
      return out;
  }
  return out;
}

}  // namespace pagoda::cli::llb
