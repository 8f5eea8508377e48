// pagoda bench serving mode: workloads, the offline run loop, the metrics
// summary and the report. The HTTP side lives in bench_http_client.cc.
#include "cli/bench_serving.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>
#include <unordered_map>

#include "base/hash.h"
#include "base/rng.h"
#include "base/timer.h"
#include "cli/bench_copy_workload.h"
#include "cli/bench_http_client.h"
#include "cli/cli_util.h"
#include "cli/command.h"
#include "cli/engine_flags.h"
#include "engine/engine.h"
#include "gguf/gguf.h"
#include "tok/tokenizer.h"

namespace pagoda::cli {
namespace bench {

// ---- Workloads ---------------------------------------------------------------

TokenSpace token_space(const tok::Tokenizer& tk) {
  TokenSpace s;
  s.bos = tk.add_bos() ? tk.bos_id() : -1;
  for (int32_t id = 0; id < tk.vocab_size(); ++id) {
    const tok::TokenType t = tk.token_type(id);
    const bool ordinary = t == tok::TokenType::kNormal || t == tok::TokenType::kByte ||
                          t == tok::TokenType::kUserDefined;
    if (ordinary && !tk.is_control(id) && !tk.is_eog(id) && id != tk.bos_id()) s.ordinary.push_back(id);
  }
  return s;
}

namespace {

int32_t uniform_len(Rng& rng, int len, double ratio) {
  const int64_t lo = std::max<int64_t>(1, static_cast<int64_t>(std::floor(len * (1.0 - ratio))));
  const int64_t hi = std::max<int64_t>(lo, static_cast<int64_t>(std::ceil(len * (1.0 + ratio))));
  return static_cast<int32_t>(rng.uniform_int(lo, hi));
}

// Appends n random ordinary ids.
void append_random(Rng& rng, const TokenSpace& space, int64_t n, std::vector<int32_t>* out) {
  const int64_t m = static_cast<int64_t>(space.ordinary.size());
  for (int64_t i = 0; i < n; ++i) out->push_back(space.ordinary[static_cast<size_t>(rng.uniform_int(0, m - 1))]);
}

}  // namespace

std::vector<BenchRequest> make_random_workload(const TokenSpace& space, int num_prompts, int input_len, int output_len,
                                               double range_ratio, uint64_t seed) {
  Rng rng(seed);
  std::vector<BenchRequest> reqs(static_cast<size_t>(std::max(num_prompts, 0)));
  for (BenchRequest& r : reqs) {
    const int32_t in = uniform_len(rng, input_len, range_ratio);
    r.max_tokens = uniform_len(rng, output_len, range_ratio);
    if (space.bos >= 0) r.prompt.push_back(space.bos);
    append_random(rng, space, in - static_cast<int64_t>(r.prompt.size()), &r.prompt);
  }
  return reqs;
}

std::vector<BenchRequest> make_shared_prefix_workload(const TokenSpace& space, int num_groups, int prompts_per_group,
                                                      int prefix_len, int suffix_len, int output_len, uint64_t seed) {
  Rng rng(seed);
  std::vector<BenchRequest> reqs;
  for (int g = 0; g < num_groups; ++g) {
    std::vector<int32_t> prefix;
    if (space.bos >= 0 && prefix_len > 0) prefix.push_back(space.bos);
    append_random(rng, space, prefix_len - static_cast<int64_t>(prefix.size()), &prefix);
    for (int i = 0; i < prompts_per_group; ++i) {
      BenchRequest r;
      r.prompt = prefix;
      if (r.prompt.empty() && space.bos >= 0) r.prompt.push_back(space.bos);
      append_random(rng, space, prefix_len + suffix_len - static_cast<int64_t>(r.prompt.size()), &r.prompt);
      r.max_tokens = output_len;
      reqs.push_back(std::move(r));
    }
  }
  // Fisher-Yates with the same seed stream: deterministic order, groups interleaved.
  for (size_t i = reqs.size(); i > 1; --i) {
    const size_t j = static_cast<size_t>(rng.uniform_int(0, static_cast<int64_t>(i) - 1));
    std::swap(reqs[i - 1], reqs[j]);
  }
  return reqs;
}

Expected<std::vector<BenchRequest>> load_dataset(const std::string& path, const tok::Tokenizer& tk,
                                                 int default_max_tokens, int num_prompts) {
  std::ifstream in(path);
  if (!in) return errorf("dataset %s: cannot open: %s", path.c_str(), std::strerror(errno));
  std::vector<BenchRequest> reqs;
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (num_prompts > 0 && static_cast<int>(reqs.size()) >= num_prompts) break;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object())
      return errorf("dataset %s line %d: not a JSON object", path.c_str(), line_no);
    auto p = j.find("prompt");
    if (p == j.end() || !p->is_string())
      return errorf("dataset %s line %d: needs a string \"prompt\"", path.c_str(), line_no);
    BenchRequest r;
    r.prompt = tk.encode(p->get<std::string>(), /*add_special=*/true, /*parse_special=*/true);
    r.max_tokens = default_max_tokens;
    if (auto m = j.find("max_tokens"); m != j.end() && !m->is_null()) {
      if (!m->is_number_integer() || m->get<int64_t>() < 1 || m->get<int64_t>() > INT32_MAX)
        return errorf("dataset %s line %d: \"max_tokens\" must be a positive integer", path.c_str(), line_no);
      r.max_tokens = static_cast<int32_t>(m->get<int64_t>());
    }
    if (r.prompt.empty()) return errorf("dataset %s line %d: the prompt encodes to no tokens", path.c_str(), line_no);
    reqs.push_back(std::move(r));
  }
  if (reqs.empty()) return errorf("dataset %s: no prompts", path.c_str());
  return reqs;
}

std::vector<double> arrival_times(int n, double rate, uint64_t seed) {
  std::vector<double> t(static_cast<size_t>(std::max(n, 0)), 0.0);
  if (!std::isfinite(rate) || rate <= 0) return t;
  Rng rng(seed ^ 0xA5A5F00DCAFEull);  // its own stream: the rate never changes the prompts
  for (size_t i = 1; i < t.size(); ++i) t[i] = t[i - 1] + rng.exponential(rate);
  return t;
}

// ---- Metrics -----------------------------------------------------------------

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double rank = std::clamp(p, 0.0, 100.0) / 100.0 * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (rank - static_cast<double>(lo));
}

namespace {

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

void stats_ms(const std::vector<double>& sec, double* m, double* p50, double* p99) {
  *m = mean(sec) * 1e3;
  *p50 = percentile(sec, 50) * 1e3;
  *p99 = percentile(sec, 99) * 1e3;
}

}  // namespace

Summary summarize(const std::vector<RequestResult>& results, const RunExtras& extras) {
  Summary s;
  s.num_prompts = static_cast<int>(results.size());
  std::vector<double> ttft, tpot, itl, e2el;
  int64_t cached = 0, cached_prompt = 0;
  bool cached_known = true, ids_known = true;
  std::vector<uint8_t> id_bytes, text_bytes;
  auto put = [](std::vector<uint8_t>* b, const void* p, size_t n) {
    const auto* c = static_cast<const uint8_t*>(p);
    b->insert(b->end(), c, c + n);
  };
  for (const RequestResult& r : results) {
    if (!r.ok) {
      ++s.failed;
      if (s.first_error.empty()) s.first_error = r.error;
      const uint32_t marker = 0xFFFFFFFFu;  // a failed request still moves the hash
      put(&id_bytes, &marker, 4);
      const uint64_t tmark = ~0ull;
      put(&text_bytes, &tmark, 8);
      continue;
    }
    ++s.completed;
    s.total_input_tokens += r.prompt_tokens;
    s.total_output_tokens += r.output_tokens;
    ttft.push_back(r.ttft);
    e2el.push_back(r.e2e);
    if (r.output_tokens > 1) tpot.push_back((r.e2e - r.ttft) / static_cast<double>(r.output_tokens - 1));
    itl.insert(itl.end(), r.itl.begin(), r.itl.end());
    if (r.cached_tokens >= 0) {
      cached += r.cached_tokens;
      cached_prompt += r.prompt_tokens;
    } else {
      cached_known = false;
    }
    ids_known = ids_known && r.ids_known;
    const uint32_t count = static_cast<uint32_t>(r.output_ids.size());
    put(&id_bytes, &count, 4);
    put(&id_bytes, r.output_ids.data(), r.output_ids.size() * sizeof(int32_t));
    const uint64_t size = r.text.size();
    put(&text_bytes, &size, 8);
    put(&text_bytes, r.text.data(), r.text.size());
  }
  s.duration_s = extras.duration;
  if (s.duration_s > 0) {
    s.request_throughput = s.completed / s.duration_s;
    s.output_tokens_per_s = static_cast<double>(s.total_output_tokens) / s.duration_s;
    s.total_tokens_per_s = static_cast<double>(s.total_input_tokens + s.total_output_tokens) / s.duration_s;
  }
  if (extras.steady_decode_time > 0) s.steady_decode_tokens_per_s = extras.steady_decode_tokens / extras.steady_decode_time;
  stats_ms(ttft, &s.ttft_ms_mean, &s.ttft_ms_p50, &s.ttft_ms_p99);
  stats_ms(tpot, &s.tpot_ms_mean, &s.tpot_ms_p50, &s.tpot_ms_p99);
  stats_ms(itl, &s.itl_ms_mean, &s.itl_ms_p50, &s.itl_ms_p99);
  stats_ms(e2el, &s.e2el_ms_mean, &s.e2el_ms_p50, &s.e2el_ms_p99);
  if (cached_known && s.completed > 0 && cached_prompt > 0)
    s.prefix_hit_rate = static_cast<double>(cached) / static_cast<double>(cached_prompt);
  s.peak_kv_usage = extras.peak_kv_usage;
  s.num_preemptions = extras.num_preemptions;
  s.output_hash_known = ids_known;
  s.output_hash = xxh3_64(id_bytes.data(), id_bytes.size());
  s.output_text_hash = xxh3_64(text_bytes.data(), text_bytes.size());
  return s;
}

namespace {

void line(std::string* out, const char* label, const std::string& value) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "%-40s %s\n", label, value.c_str());
  *out += buf;
}
std::string f2(double v) {
  char b[64];
  std::snprintf(b, sizeof(b), "%.2f", v);
  return b;
}
std::string i64(int64_t v) { return std::to_string(v); }
std::string hex(uint64_t v) {
  char b[32];
  std::snprintf(b, sizeof(b), "%016" PRIx64, v);
  return b;
}
// "====== title ======" centred in 50 columns, like vLLM.
std::string banner(const char* title, char fill) {
  const size_t n = 50, len = std::strlen(title);
  const size_t left = len >= n ? 0 : (n - len) / 2, right = len >= n ? 0 : n - len - left;
  return std::string(left, fill) + title + std::string(right, fill) + "\n";
}

}  // namespace

std::string format_report(const Summary& s) {
  std::string o = banner(" Serving Benchmark Result ", '=');
  line(&o, "Successful requests:", i64(s.completed));
  line(&o, "Failed requests:", i64(s.failed));
  if (s.max_concurrency > 0) line(&o, "Maximum request concurrency:", i64(s.max_concurrency));
  line(&o, "Request rate configured (RPS):", std::isfinite(s.request_rate) ? f2(s.request_rate) : "inf");
  line(&o, "Benchmark duration (s):", f2(s.duration_s));
  line(&o, "Total input tokens:", i64(s.total_input_tokens));
  line(&o, "Total generated tokens:", i64(s.total_output_tokens));
  line(&o, "Request throughput (req/s):", f2(s.request_throughput));
  line(&o, "Output token throughput (tok/s):", f2(s.output_tokens_per_s));
  line(&o, "Total token throughput (tok/s):", f2(s.total_tokens_per_s));
  line(&o, "Steady decode throughput (tok/s):",
       s.steady_decode_tokens_per_s >= 0 ? f2(s.steady_decode_tokens_per_s) : "n/a");
  // vLLM's latency sections: a banner, then mean / median / p99 in ms.
  const struct {
    const char* title;
    const char* metric;
    double mean, p50, p99;
  } latencies[] = {
      {"Time to First Token", "TTFT", s.ttft_ms_mean, s.ttft_ms_p50, s.ttft_ms_p99},
      {"Time per Output Token (excl. 1st token)", "TPOT", s.tpot_ms_mean, s.tpot_ms_p50, s.tpot_ms_p99},
      {"Inter-token Latency", "ITL", s.itl_ms_mean, s.itl_ms_p50, s.itl_ms_p99},
      {"End-to-end Latency", "E2EL", s.e2el_ms_mean, s.e2el_ms_p50, s.e2el_ms_p99},
  };
  for (const auto& l : latencies) {
    o += banner(l.title, '-');
    line(&o, ("Mean " + std::string(l.metric) + " (ms):").c_str(), f2(l.mean));
    line(&o, ("Median " + std::string(l.metric) + " (ms):").c_str(), f2(l.p50));
    line(&o, ("P99 " + std::string(l.metric) + " (ms):").c_str(), f2(l.p99));
  }
  o += banner("KV cache", '-');
  line(&o, "Peak KV cache usage (%):", s.peak_kv_usage >= 0 ? f2(s.peak_kv_usage * 100) : "n/a");
  line(&o, "Prefix cache hit rate (%):", s.prefix_hit_rate >= 0 ? f2(s.prefix_hit_rate * 100) : "n/a");
  line(&o, "Preemptions:", s.num_preemptions >= 0 ? i64(s.num_preemptions) : "n/a");
  line(&o, "Output hash (token ids):", s.output_hash_known ? hex(s.output_hash) : "n/a");
  line(&o, "Output hash (text):", hex(s.output_text_hash));
  o += std::string(50, '=') + "\n";
  return o;
}

std::string format_json(const Summary& s) {
  using json = nlohmann::ordered_json;  // fields in the documented order
  auto opt = [](bool known, json v) { return known ? v : json(); };
  json j = {
      {"mode", s.mode},
      {"workload", s.workload},
      {"model", s.model},
      {"num_prompts", s.num_prompts},
      {"max_concurrency", opt(s.max_concurrency > 0, s.max_concurrency)},
      {"request_rate", opt(std::isfinite(s.request_rate), s.request_rate)},
      {"seed", s.seed},
      {"completed", s.completed},
      {"failed", s.failed},
      {"first_error", opt(!s.first_error.empty(), s.first_error)},
      {"duration_s", s.duration_s},
      {"total_input_tokens", s.total_input_tokens},
      {"total_output_tokens", s.total_output_tokens},
      {"request_throughput", s.request_throughput},
      {"output_tokens_per_s", s.output_tokens_per_s},
      {"total_tokens_per_s", s.total_tokens_per_s},
      {"steady_decode_tokens_per_s", opt(s.steady_decode_tokens_per_s >= 0, s.steady_decode_tokens_per_s)},
      {"ttft_ms_mean", s.ttft_ms_mean}, {"ttft_ms_p50", s.ttft_ms_p50}, {"ttft_ms_p99", s.ttft_ms_p99},
      {"tpot_ms_mean", s.tpot_ms_mean}, {"tpot_ms_p50", s.tpot_ms_p50}, {"tpot_ms_p99", s.tpot_ms_p99},
      {"itl_ms_mean", s.itl_ms_mean}, {"itl_ms_p50", s.itl_ms_p50}, {"itl_ms_p99", s.itl_ms_p99},
      {"e2el_ms_mean", s.e2el_ms_mean}, {"e2el_ms_p50", s.e2el_ms_p50}, {"e2el_ms_p99", s.e2el_ms_p99},
      {"prefix_hit_rate", opt(s.prefix_hit_rate >= 0, s.prefix_hit_rate)},
      {"peak_kv_usage", opt(s.peak_kv_usage >= 0, s.peak_kv_usage)},
      {"num_preemptions", opt(s.num_preemptions >= 0, s.num_preemptions)},
      {"output_hash", opt(s.output_hash_known, hex(s.output_hash))},
      {"output_text_hash", hex(s.output_text_hash)},
  };
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

// ---- Offline run -------------------------------------------------------------

std::vector<RequestResult> run_offline(engine::Engine& eng, const std::vector<BenchRequest>& requests,
                                       const RunOptions& opts, RunExtras* extras) {
  const size_t n = requests.size();
  std::vector<RequestResult> results(n);
  const std::vector<double> arrivals = arrival_times(static_cast<int>(n), opts.request_rate, opts.seed);
  const size_t limit = opts.max_concurrency > 0 ? static_cast<size_t>(opts.max_concurrency) : SIZE_MAX;
  struct Live {
    size_t index;
    double submitted;
    double last = 0;
    bool got_first = false;
  };
  std::unordered_map<engine::RequestId, Live> live;
  *extras = RunExtras{};
  extras->peak_kv_usage = 0;
  const int64_t preemptions0 = eng.stats().num_preemptions;
  const double t0 = now_seconds();
  double last_finish = t0;
  size_t next = 0, done = 0;

  auto finish = [&](std::unordered_map<engine::RequestId, Live>::iterator it, double t, std::string error) {
    RequestResult& r = results[it->second.index];
    r.e2e = t - it->second.submitted;
    r.ok = error.empty();
    r.error = std::move(error);
    r.output_tokens = static_cast<int64_t>(r.output_ids.size());
    r.ids_known = true;
    live.erase(it);
    ++done;
    last_finish = std::max(last_finish, t);
  };

  while (done < n) {
    // Admit every request whose arrival time has come, in order, while there is room.
    while (next < n && arrivals[next] <= now_seconds() - t0 && live.size() < limit) {
      const BenchRequest& br = requests[next];
      engine::RequestParams p;
      p.prompt = br.prompt;
      p.max_tokens = br.max_tokens;
      p.temperature = 0.0f;
      p.ignore_eos = opts.ignore_eos;
      RequestResult& r = results[next];
      r.prompt_tokens = static_cast<int64_t>(br.prompt.size());
      r.cached_tokens = 0;
      const double submitted = now_seconds();
      auto id = eng.add_request(p);
      if (!id.ok()) {
        r.error = id.message();
        ++done;
      } else {
        live.emplace(*id, Live{next, submitted});
      }
      ++next;
    }
    if (live.empty()) {
      if (next < n) {
        const double wait = t0 + arrivals[next] - now_seconds();
        if (wait > 0) std::this_thread::sleep_for(std::chrono::duration<double>(wait));
      }
      continue;
    }
    bool steady = true;  // every request in flight already decoding
    for (const auto& [id, l] : live) steady = steady && l.got_first;
    const size_t in_flight = live.size();
    const double ts = now_seconds();
    std::vector<engine::TokenEvent> events = eng.step();
    const double te = now_seconds();
    const engine::EngineStats st = eng.stats();
    extras->peak_kv_usage = std::max(extras->peak_kv_usage, st.kv_usage);
    size_t advanced = 0;
    int64_t step_tokens = 0;
    for (engine::TokenEvent& ev : events) {
      auto it = live.find(ev.id);
      if (it == live.end()) continue;
      Live& l = it->second;
      RequestResult& r = results[l.index];
      if (!ev.tokens.empty()) {
        if (!l.got_first) {
          r.ttft = te - l.submitted;
          l.got_first = true;
        } else {
          r.itl.push_back(te - l.last);
        }
        l.last = te;
        ++advanced;
        step_tokens += static_cast<int64_t>(ev.tokens.size());
        r.output_ids.insert(r.output_ids.end(), ev.tokens.begin(), ev.tokens.end());
      }
      r.text += ev.text;
      if (ev.num_cached_tokens > 0) r.cached_tokens = ev.num_cached_tokens;
      if (ev.num_prompt_tokens > 0) r.prompt_tokens = ev.num_prompt_tokens;
      if (ev.finish == engine::FinishReason::kError || ev.finish == engine::FinishReason::kAbort) {
        finish(it, te, ev.error.empty() ? std::string("request ") + engine::finish_reason_name(ev.finish) : ev.error);
      } else if (ev.finish != engine::FinishReason::kNone) {
        finish(it, te, "");
      }
    }
    if (steady && advanced == in_flight && step_tokens > 0) {
      extras->steady_decode_tokens += static_cast<double>(step_tokens);
      extras->steady_decode_time += te - ts;
    }
    // An engine with nothing left to do cannot finish the requests still in flight.
    if (events.empty() && !eng.has_unfinished()) {
      while (!live.empty()) finish(live.begin(), te, "the engine dropped the request");
    }
  }
  extras->duration = last_finish - t0;
  extras->num_preemptions = eng.stats().num_preemptions - preemptions0;
  return results;
}

}  // namespace bench

// ---- Command line ------------------------------------------------------------

namespace {

const char* kServingHelp =
    "usage: pagoda bench (--workload random|shared-prefix | --dataset FILE.jsonl) [--server URL] [options]\n"
    "Serving benchmark: the workload runs offline through one in-process engine, or against an\n"
    "OpenAI-compatible server with --server (POST URL/v1/completions, streamed, token-id prompts).\n"
    "\n"
    "workloads:\n"
    "  --workload random             random ordinary token ids (BOS first when the model adds one)\n"
    "    --num-prompts N             requests (default 64)\n"
    "    --input-len L --output-len O  prompt / output tokens (default 128 / 128)\n"
    "    --range-ratio R             lengths uniform in [L*(1-R), L*(1+R)] (default 0)\n"
    "  --workload shared-prefix      G prefixes x R distinct suffixes, shuffled\n"
    "    --num-groups G --prompts-per-group R   (default 4 x 8)\n"
    "    --prefix-len P --suffix-len Q --output-len O   (default 256 / 32 / 128)\n"
    "  --workload copy               \"repeat this code with one change\" chat prompts (bench_copy_workload.h;\n"
    "                                --num-prompts, --output-len; ends at end of generation)\n"
    "  --dataset FILE.jsonl          lines of {\"prompt\": str, \"max_tokens\": int} (first --num-prompts lines)\n"
    "common:\n"
    "  --max-concurrency C           at most C requests in flight (default: unlimited; server mode: 256)\n"
    "  --request-rate R              Poisson arrivals at R req/s (default inf: all at once)\n"
    "  --seed S                      seed of prompts and arrivals (default 0)\n"
    "  --ignore-eos / --no-ignore-eos  generate exactly max_tokens (default on for random/shared-prefix)\n"
    "  --json                        print one JSON object instead of the text block\n"
    "server mode:\n"
    "  --server URL                  e.g. http://127.0.0.1:8080 (the local -m model gives the tokenizer)\n"
    "  --model-name NAME             \"model\" field (default: first id of GET /v1/models)\n"
    "  --api-key KEY                 sent as 'Authorization: Bearer KEY'\n"
    "  --request-timeout S           per-request limit in seconds (default 600)\n"
    "engine (offline mode; -m also gives the tokenizer in server mode):\n";

std::string double_opt(Args& args, const char* name, double lo, double hi, double* out) {
  std::string v;
  if (!args.value(name, &v)) return "";
  if (v == "inf") {
    *out = std::numeric_limits<double>::infinity();
  } else {
    double d = 0;
    if (!parse_f64(v, &d) || !(d >= lo && d <= hi)) return std::string(name) + " must be a number, got '" + v + "'";
    *out = d;
  }
  return "";
}

}  // namespace

int bench_serving_main(int argc, char** argv) {
  Args args(argc, argv);
  if (args.help()) return print_usage(kServingHelp, kEngineFlagsHelp);
  engine::EngineConfig ecfg;
  std::string err = parse_engine_flags(args, &ecfg);
  std::string workload, dataset, server_url, model_name, api_key;
  args.value("--workload", &workload);
  args.value("--dataset", &dataset);
  args.value("--server", &server_url);
  args.value("--model-name", &model_name);
  args.value("--api-key", &api_key);
  int num_prompts = 64, input_len = 128, output_len = 128, groups = 4, per_group = 8, prefix_len = 256,
      suffix_len = 32, concurrency = 0;
  int64_t seed = 0;
  double range_ratio = 0, rate = std::numeric_limits<double>::infinity(), timeout_s = 600;
  const bool num_prompts_given = [&] {
    std::string v;
    Args probe = args;  // peek without consuming
    return probe.value("--num-prompts", &v);
  }();
  for (std::string e : {int_option(args, "--num-prompts", 1, 1000000, &num_prompts),
                        int_option(args, "--input-len", 1, 1 << 24, &input_len),
                        int_option(args, "--output-len", 1, 1 << 24, &output_len),
                        int_option(args, "--num-groups", 1, 100000, &groups),
                        int_option(args, "--prompts-per-group", 1, 100000, &per_group),
                        int_option(args, "--prefix-len", 0, 1 << 24, &prefix_len),
                        int_option(args, "--suffix-len", 0, 1 << 24, &suffix_len),
                        int_option(args, "--max-concurrency", 1, 100000, &concurrency),
                        double_opt(args, "--range-ratio", 0, 1, &range_ratio),
                        double_opt(args, "--request-rate", 1e-9, 1e12, &rate),
                        double_opt(args, "--request-timeout", 1e-3, 1e7, &timeout_s)}) {
    if (err.empty()) err = e;
  }
  if (std::string v; args.value("--seed", &v) && !parse_int(v, 0, INT64_MAX, &seed) && err.empty())
    err = "--seed must be a non-negative integer, got '" + v + "'";
  const bool no_ignore_eos = args.flag("--no-ignore-eos");
  const bool ignore_eos_flag = args.flag("--ignore-eos");
  const bool as_json = args.flag("--json");
  if (err.empty()) err = args.leftover();
  if (err.empty() && workload.empty() && dataset.empty())
    err = "give --workload random|shared-prefix or --dataset FILE.jsonl";
  if (err.empty() && !workload.empty() && !dataset.empty()) err = "give either --workload or --dataset, not both";
  if (err.empty() && !workload.empty() && workload != "random" && workload != "shared-prefix" && workload != "copy")
    err = "--workload must be random, shared-prefix or copy, got '" + workload + "'";
  if (err.empty() && workload == "shared-prefix" && prefix_len + suffix_len < 1)
    err = "--prefix-len + --suffix-len must be at least 1";
  if (!err.empty()) {
    std::fprintf(stderr, "pagoda bench: %s\n", err.c_str());
    return 2;
  }
  if (workload == "shared-prefix" && num_prompts_given)
    std::fprintf(stderr, "pagoda bench: --num-prompts is ignored by shared-prefix (G x R requests)\n");

  // The engine (offline) or just the tokenizer (server mode) from the -m model.
  std::unique_ptr<engine::Engine> eng;
  std::unique_ptr<gguf::GgufFile> tok_file;
  std::unique_ptr<tok::Tokenizer> own_tok;
  const tok::Tokenizer* tk = nullptr;
  if (server_url.empty()) {
    auto e = engine::Engine::create(ecfg);
    if (!e.ok()) {
      std::fprintf(stderr, "pagoda bench: %s\n", e.message().c_str());
      return 1;
    }
    eng = std::move(e).value();
    tk = &eng->tokenizer();
  } else {
    auto f = gguf::GgufFile::open(ecfg.model_path);
    if (!f.ok()) {
      std::fprintf(stderr, "pagoda bench: tokenizer model: %s\n", f.message().c_str());
      return 1;
    }
    tok_file = std::move(f).value();
    auto t = tok::Tokenizer::from_gguf(*tok_file);
    if (!t.ok()) {
      std::fprintf(stderr, "pagoda bench: tokenizer of %s: %s\n", ecfg.model_path.c_str(), t.message().c_str());
      return 1;
    }
    own_tok = std::move(t).value();
    tk = own_tok.get();
  }

  std::vector<bench::BenchRequest> reqs;
  if (!dataset.empty()) {
    auto d = bench::load_dataset(dataset, *tk, output_len, num_prompts_given ? num_prompts : 0);
    if (!d.ok()) {
      std::fprintf(stderr, "pagoda bench: %s\n", d.message().c_str());
      return 1;
    }
    reqs = std::move(d).value();
  } else if (workload == "copy") {  // bench_copy_workload.cc
    auto c = bench::make_copy_workload(*tk, num_prompts, output_len, static_cast<uint64_t>(seed));
    if (!c.ok()) {
      std::fprintf(stderr, "pagoda bench: %s\n", c.message().c_str());
      return 1;
    }
    reqs = std::move(c).value();
  } else {
    const bench::TokenSpace space = bench::token_space(*tk);
    if (space.ordinary.empty()) {
      std::fprintf(stderr, "pagoda bench: the vocabulary has no ordinary tokens to build random prompts from\n");
      return 1;
    }
    reqs = workload == "random"
               ? bench::make_random_workload(space, num_prompts, input_len, output_len, range_ratio,
                                             static_cast<uint64_t>(seed))
               : bench::make_shared_prefix_workload(space, groups, per_group, prefix_len, suffix_len, output_len,
                                                    static_cast<uint64_t>(seed));
  }

  bench::RunOptions ro;
  ro.max_concurrency = concurrency;
  ro.request_rate = rate;
  ro.seed = static_cast<uint64_t>(seed);
  ro.ignore_eos = dataset.empty() && workload != "copy" ? !no_ignore_eos : ignore_eos_flag && !no_ignore_eos;
  bench::RunExtras extras;
  std::vector<bench::RequestResult> results;
  std::string served_model;
  if (server_url.empty()) {
    results = bench::run_offline(*eng, reqs, ro, &extras);
    served_model = eng->model_info().name;
  } else {
    auto url = bench::parse_server_url(server_url);
    if (!url.ok()) {
      std::fprintf(stderr, "pagoda bench: %s\n", url.message().c_str());
      return 2;
    }
    bench::ServerRunOptions so;
    so.run = ro;
    so.model_name = model_name;
    so.api_key = api_key;
    so.request_timeout_s = timeout_s;
    results = bench::run_server(*url, reqs, &so, &extras);
    served_model = so.model_name;
    ro.max_concurrency = so.run.max_concurrency;
  }

  bench::Summary s = bench::summarize(results, extras);
  s.mode = server_url.empty() ? "offline" : "server";
  s.workload = dataset.empty() ? workload : "dataset:" + dataset;
  s.model = served_model;
  s.max_concurrency = ro.max_concurrency;
  s.request_rate = rate;
  s.seed = static_cast<uint64_t>(seed);
  if (as_json) {
    std::printf("%s\n", bench::format_json(s).c_str());
  } else {
    std::printf("%s", bench::format_report(s).c_str());
  }
  if (!s.first_error.empty()) std::fprintf(stderr, "pagoda bench: first failure: %s\n", s.first_error.c_str());
  std::fflush(stdout);
  return s.completed > 0 ? 0 : 1;
}

namespace {
const Register kBenchServing("bench-serving", "serving benchmark (same as bench --workload/--dataset/--server)",
                             bench_serving_main);
}  // namespace

}  // namespace pagoda::cli
