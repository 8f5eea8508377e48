// pagoda run: generate text for one prompt, one sequence, streaming to stdout.
// Statistics go to stderr (or everything into one JSON object with --json).
// It drives engine::Engine, the path serve and the workload benchmarks use, through
// the load driver (loadgen/driver.h): one request in an engine whose KV pool holds
// exactly one context.
#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/kv_dtype.h"
#include "base/log.h"
#include "base/log_control.h"
#include "cli/cli_util.h"
#include "cli/command.h"
#include "cli/engine_flags.h"
#include "cli/speculative_flags.h"
#include "engine/engine.h"
#include "grammar/cache.h"
#include "loadgen/driver.h"
#include "sample/params.h"
#include "tok/chat_template.h"
#include "tok/tokenizer.h"

namespace pagoda::cli {
namespace {

const char* kRunUsage =
    "usage: pagoda run [MODEL | -m MODEL] -p PROMPT [options]\n"
    "\n"
    "  -m, --model PATH      GGUF model (default: $PAGODA_MODEL or models/SmolLM2-135M-Instruct.Q4_1.gguf)\n"
    "  -p, --prompt TEXT     prompt text\n"
    "      --prompt-ids IDS  prompt as comma-separated token ids (instead of -p; no BOS or template added)\n"
    "  -n, --n-predict N     tokens to generate, >= 1 (default -1: until end of generation or full context)\n"
    "      --chat            wrap the prompt in the model's chat template (user turn + generation prompt);\n"
    "                        control-token text in the prompt stays plain text there\n"
    "      --chat-template FILE  Jinja chat template replacing the model's (implies --chat); or\n"
    "                        --chat-template-file FILE\n"
    "      --temp T          temperature (default 0.8; 0 = greedy)\n"
    "      --top-k K         (default 40; 0 = off)\n"
    "      --top-p P         (default 0.95; 1 = off)\n"
    "      --min-p P         (default 0.05; 0 = off)\n"
    "      --repeat-penalty R, --presence-penalty P, --frequency-penalty F  (default off)\n"
    "  -s, --seed S          RNG seed (default or -1: random, printed)\n"
    "      --stop TEXT       stop string (repeatable)\n"
    "      --ignore-eos      keep generating past end-of-generation tokens\n"
    "  -t, --threads N       CPU threads (default: all cores)\n"
    "  -c, --ctx-size N      context length in tokens (default: the model's)\n"
    "      --kv-dtype T      f32 | f16 | bf16 | q8_0 | q4_0 | q4_1 | iq4_nl | q5_0 | q5_1 (default f16),\n"
    "                        K and V; also --kv-cache-dtype (vLLM); -ctk T / -ctv T (llama.cpp) each alone\n"
    "      --block-size N    KV block size in tokens (default 16)\n"
    "      --state-checkpoint-interval K   hybrid models: a state checkpoint every K blocks (default 4;\n"
    "                        0 = off; one request shares no prefix, so it only validates here)\n"
    "      --no-kv-cache     recompute the whole sequence every step (baseline)\n"
    "      --ref-kernels     scalar reference kernels (debugging)\n"
    "      --disable-hybrid-kv-cache-manager   every layer keeps a full-context KV table\n"
    "      --json-schema FILE  constrain the output to JSON valid under the JSON schema in FILE\n"
    "                        (generation stops when the value is complete)\n"
    "      --grammar-regex RE  constrain the whole output to match the regex RE\n"
    "      --json            print one JSON object instead of streaming\n"
    "      --logits-out FILE write the logits of the first sampled step (n_vocab little-endian f32) to FILE\n"
    "      --force-tokens IDS  teacher forcing: the first generated tokens are these comma-separated ids\n"
    "                        whatever the sampler would pick (the JSON adds argmax_tokens: the greedy\n"
    "                        pick at each step); sampling continues after them up to -n\n"
    "      --logits-out-all FILE  write the logits of every sampled step ([steps, n_vocab] f32) to FILE\n"
    "      --log-level L, -v/--verbose, --version; llama.cpp's GPU flags (-ngl N, -fa [on|off|auto])\n"
    "                        are accepted with a warning (see `pagoda serve --help`)\n"
    PAGODA_SPECULATIVE_FLAGS_HELP
    "Every flag can also be set as PAGODA_<FLAG> (e.g. PAGODA_THREADS=4).\n";

struct RunOptions {
  std::string model;
  std::string prompt;
  bool have_prompt = false;
  std::vector<int32_t> prompt_ids;  // --prompt-ids: used as is when non-empty
  std::string logits_out;
  std::string logits_out_all;
  std::vector<int32_t> force_tokens;  // --force-tokens: generated tokens 0..k-1 are these
  int64_t n_predict = -1;
  bool chat = false;
  std::string chat_template;  // --chat-template: the file's Jinja source
  sample::SamplingParams sampling = sample::llama_cpp_defaults();
  bool have_seed = false;
  int threads = 0;
  int64_t ctx = 0;
  KvTypes kv_dtype = KvDtype::F16;
  int32_t block_size = 16;
  int32_t state_checkpoint_interval = 4;
  bool no_kv_cache = false;
  bool ref_kernels = false;
  bool no_hybrid_kv = false;  // --disable-hybrid-kv-cache-manager
  bool json = false;
  grammar::ConstraintSpec constraint;  // --json-schema / --grammar-regex
  engine::SpeculativeConfig speculative;  // --speculative-config / --speculative-ngram
};

// "1,2,3" -> ids (each in [0, INT32_MAX]); false on any malformed entry or an empty list.
bool parse_ids(const char* s, std::vector<int32_t>* out) {
  out->clear();
  std::string cur;
  for (const char* p = s;; ++p) {
    if (*p == ',' || *p == '\0') {
      int64_t v = 0;
      if (!parse_i64(cur.c_str(), &v) || v < 0 || v > INT32_MAX) return false;
      out->push_back(static_cast<int32_t>(v));
      cur.clear();
      if (*p == '\0') break;
    } else {
      cur += *p;
    }
  }
  return !out->empty();
}

bool parse_f32(const char* s, float* out) {
  char* end = nullptr;
  const float v = std::strtof(s, &end);
  if (end == s || *end) return false;
  *out = v;
  return true;
}

// Returns "" or an error message; sets *help for -h and *version for --version.
// Every flag goes through cli::Args, the parser of every subcommand.
std::string parse_args(int argc, char** argv, RunOptions* o, bool* help, bool* version) {
  Args args(argc, argv);
  *help = args.help();
  *version = args.version();
  if (*help || *version) return "";
  if (std::string err = parse_log_flags(args); !err.empty()) return err;
  std::string v;
  int64_t iv = 0;
  o->chat = args.flag("--chat");
  if (args.value("--chat-template", &v) || args.value("--chat-template-file", &v)) {
    if (!read_file(v, &o->chat_template)) return "--chat-template: cannot read " + v;
    o->chat = true;
  }
  std::string schema, regex;
  const bool have_schema = args.value("--json-schema", &schema), have_regex = args.value("--grammar-regex", &regex);
  if (have_schema && have_regex) return "give one of --json-schema and --grammar-regex";
  if (have_regex) {
    o->constraint.kind = grammar::ConstraintKind::kRegex;
    o->constraint.text = regex;
  } else if (have_schema) {
    if (!read_file(schema, &o->constraint.text)) return "--json-schema: cannot read " + schema;
    o->constraint.kind = grammar::ConstraintKind::kJsonSchema;
  }
  o->json = args.flag("--json");
  o->no_kv_cache = args.flag("--no-kv-cache");
  o->ref_kernels = args.flag("--ref-kernels");
  o->no_hybrid_kv = args.flag("--disable-hybrid-kv-cache-manager");
  if (args.flag("--ignore-eos")) o->sampling.ignore_eos = true;
  if (args.value("--speculative-config", &v)) {
    if (std::string e = parse_speculative_config_json(v, &o->speculative); !e.empty()) return e;
  }
  if (args.value("--speculative-ngram", &v)) {
    if (std::string e = parse_speculative_ngram(v, &o->speculative); !e.empty()) return e;
  }
  auto bad = [](const std::string& value, const char* flag) { return "bad value '" + value + "' for " + flag; };
  if (args.value("--model", &v, "-m")) o->model = v;
  if (args.value("--prompt", &v, "-p")) {
    o->prompt = v;
    o->have_prompt = true;
  }
  if (args.value("--prompt-ids", &v)) {
    if (!parse_ids(v.c_str(), &o->prompt_ids)) return bad(v, "--prompt-ids");
    o->have_prompt = true;
  }
  args.value("--logits-out", &o->logits_out);
  args.value("--logits-out-all", &o->logits_out_all);
  if (args.value("--force-tokens", &v) && !parse_ids(v.c_str(), &o->force_tokens)) return bad(v, "--force-tokens");
  if (args.value("--n-predict", &v, "-n") && (!parse_i64(v.c_str(), &o->n_predict) || o->n_predict == 0))
    return bad(v, "-n");  // 0 would generate nothing
  struct FloatFlag { const char* name; float* out; };
  const FloatFlag floats[] = {{"--temp", &o->sampling.temperature},
                              {"--top-p", &o->sampling.top_p},
                              {"--min-p", &o->sampling.min_p},
                              {"--repeat-penalty", &o->sampling.repetition_penalty},
                              {"--presence-penalty", &o->sampling.presence_penalty},
                              {"--frequency-penalty", &o->sampling.frequency_penalty}};
  for (const FloatFlag& f : floats)
    if (args.value(f.name, &v) && !parse_f32(v.c_str(), f.out)) return bad(v, f.name);
  if (args.value("--top-k", &v)) {
    if (!parse_int(v, 0, INT32_MAX, &iv)) return bad(v, "--top-k");
    o->sampling.top_k = static_cast<int32_t>(iv);
  }
  if (args.value("--seed", &v, "-s")) {
    if (!parse_i64(v.c_str(), &iv)) return bad(v, "--seed");
    if (iv != -1) {  // llama.cpp's -1: random
      o->sampling.seed = static_cast<uint64_t>(iv);
      o->have_seed = true;
    }
  }
  for (const std::string& stop : args.values("--stop")) {
    std::vector<std::string> stops = o->sampling.stop.list();
    stops.push_back(stop);
    o->sampling.stop = std::move(stops);
  }
  if (args.value("--threads", &v, "-t")) {
    if (!parse_int(v, 1, 1024, &iv)) return bad(v, "-t");
    o->threads = static_cast<int>(iv);
  }
  if (args.value("--ctx-size", &v, "-c") && !parse_int(v, 1, 1 << 24, &o->ctx)) return bad(v, "-c");
  if (std::string err = read_kv_dtype_flags(args, &o->kv_dtype); !err.empty()) return err;
  if (args.value("--block-size", &v)) {
    if (!parse_int(v, 1, 4096, &iv)) return bad(v, "--block-size");
    o->block_size = static_cast<int32_t>(iv);
  }
  if (args.value("--state-checkpoint-interval", &v)) {
    if (!parse_int(v, 0, 1 << 20, &iv)) return bad(v, "--state-checkpoint-interval");
    o->state_checkpoint_interval = static_cast<int32_t>(iv);
  }
  if (std::string err = parse_gpu_flags(args); !err.empty()) return err;
  if (std::string err = args.leftover(/*flags_only=*/true); !err.empty()) return err;
  const std::vector<std::string> pos = args.positionals();  // `pagoda run MODEL -p ...`
  if (pos.size() > 1) return "unexpected argument '" + pos[1] + "' (one model path at most)";
  if (!pos.empty()) {
    if (!o->model.empty()) return "the model is given twice (-m and '" + pos[0] + "')";
    o->model = pos[0];
  }
  if (!o->have_prompt) return "missing -p PROMPT";
  if (!o->prompt_ids.empty() && (!o->prompt.empty() || o->chat)) return "--prompt-ids excludes -p and --chat";
  return "";
}

// Raw little-endian f32 (the host order on every supported machine).
Status write_f32_file(const std::string& path, std::span<const float> v) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "wb"), &std::fclose);
  if (!f) return errorf("cannot open %s for writing: %s", path.c_str(), std::strerror(errno));
  if (std::fwrite(v.data(), sizeof(float), v.size(), f.get()) != v.size()) {
    return errorf("short write to %s", path.c_str());
  }
  return Status::Ok();
}

int fail(const std::string& msg) {
  std::fprintf(stderr, "pagoda run: %s\n", msg.c_str());
  return 1;
}

// Prompt text -> token ids (optionally through the chat template); *text gets
// the text that was tokenized (the rendered template with --chat).
Expected<std::vector<int32_t>> prompt_tokens(const tok::Tokenizer& tk, const RunOptions& o, std::string* text_out) {
  if (!o.prompt_ids.empty()) return o.prompt_ids;
  *text_out = o.prompt;
  if (!o.chat) return tk.encode(o.prompt, /*add_special=*/true, /*parse_special=*/true);
  PAGODA_ASSIGN_OR_RETURN(tok::ChatTemplate tmpl, o.chat_template.empty()
                                                       ? tok::ChatTemplate::from_tokenizer(tk)
                                                       : tok::ChatTemplate::from_source(tk, o.chat_template));
  const tok::ChatMessage msgs[] = {{"user", o.prompt}};
  PAGODA_ASSIGN_OR_RETURN(tok::RenderedPrompt rendered, tmpl.render_prompt(msgs, tok::ChatRenderOptions{}));
  *text_out = rendered.text;
  // BOS unless the template wrote it; the template's markers are control tokens, the
  // user's text is plain text.
  return tok::encode_prompt(tk, rendered);
}

int run_run(int argc, char** argv) {
  RunOptions o;
  bool help = false, version = false;
  const std::string perr = parse_args(argc, argv, &o, &help, &version);
  if (version) {
    std::printf("pagoda %s\n", version_string());
    return 0;
  }
  if (const std::optional<int> rc = help_or_usage_error("run", help, perr, kRunUsage)) return *rc;
  if (o.model.empty()) o.model = default_model_path();
  if (!o.have_seed) o.sampling.seed = std::random_device{}();

  engine::EngineConfig ec;
  ec.model_path = o.model;
  ec.threads = threads_or_all(o.threads);
  ec.context_length = static_cast<int>(o.ctx);  // 0: the model's
  ec.kv_dtype = o.kv_dtype;
  ec.block_size = o.block_size;
  ec.state_checkpoint_interval = o.state_checkpoint_interval;
  ec.kv_pool_one_context = true;
  ec.watermark = 0;                   // one sequence may fill the whole pool
  ec.enable_prefix_caching = false;   // one request: nothing to share
  ec.max_num_seqs = 1;
  ec.max_num_batched_tokens = static_cast<int>(o.ctx > 0 ? std::min<int64_t>(o.ctx, 2048) : 2048);
  ec.ref_kernels = o.ref_kernels;
  ec.disable_hybrid_kv_cache_manager = o.no_hybrid_kv;
  ec.recompute = o.no_kv_cache;
  ec.speculative = o.speculative;
  auto created = engine::Engine::create(ec);
  if (!created.ok()) return fail(o.model + ": " + created.message());
  engine::Engine& eng = **created;
  const engine::ModelInfo& info = eng.model_info();
  const int64_t ctx = info.context_length;

  std::string prompt_text;
  auto prompt = prompt_tokens(eng.tokenizer(), o, &prompt_text);
  if (!prompt.ok()) return fail(prompt.message());
  const int64_t n_prompt = static_cast<int64_t>(prompt->size());
  if (n_prompt == 0) return fail("the prompt encodes to no tokens");
  if (n_prompt > ctx) {
    return fail("prompt is " + std::to_string(n_prompt) + " tokens, longer than the context of " +
                std::to_string(ctx) + " tokens (-c)");
  }
  if (n_prompt == ctx) {
    return fail("prompt is " + std::to_string(n_prompt) + " tokens, the whole context of " + std::to_string(ctx) +
                " tokens (-c): no room to generate");
  }

  // The context bounds generation too: prompt + generated <= context.
  const int64_t room = ctx - n_prompt;
  engine::RequestParams rp;
  rp.prompt = *prompt;
  rp.max_tokens = static_cast<int>(o.n_predict < 0 ? room : std::min(o.n_predict, room));
  rp.temperature = o.sampling.temperature;
  rp.top_k = o.sampling.top_k;
  rp.top_p = o.sampling.top_p;
  rp.min_p = o.sampling.min_p;
  rp.repetition_penalty = o.sampling.repetition_penalty;
  rp.presence_penalty = o.sampling.presence_penalty;
  rp.frequency_penalty = o.sampling.frequency_penalty;
  rp.seed = o.sampling.seed;
  rp.has_seed = true;
  rp.stop = o.sampling.stop;
  rp.ignore_eos = o.sampling.ignore_eos;
  rp.forced_tokens = o.force_tokens;
  rp.return_logits = !o.logits_out.empty() || !o.logits_out_all.empty();
  if (!o.constraint.empty()) {
    auto g = grammar::compile_constraint(o.constraint, grammar::GrammarOptions{});
    if (!g.ok()) return fail((o.constraint.kind == grammar::ConstraintKind::kRegex ? "--grammar-regex: " : "--json-schema: ") + g.message());
    auto ti = grammar::TokenIndex::from_tokenizer(eng.tokenizer());
    if (!ti.ok()) return fail(ti.message());
    rp.grammar = std::make_shared<const grammar::CompiledGrammar>(std::move(g).value(), std::move(ti).value());
  }
  std::string text;
  auto emit = [&](const std::string& s) {
    if (s.empty()) return;
    text += s;
    if (!o.json) {
      std::fwrite(s.data(), 1, s.size(), stdout);
      std::fflush(stdout);
    }
  };
  std::unique_ptr<FILE, int (*)(FILE*)> all_logits(nullptr, &std::fclose);
  if (!o.logits_out_all.empty()) {
    all_logits.reset(std::fopen(o.logits_out_all.c_str(), "wb"));
    if (!all_logits) return fail("cannot open " + o.logits_out_all + " for writing: " + std::strerror(errno));
  }

  // The driver steps the engine and keeps the tokens and step times (steps up to the
  // first token are the prefill; each later step decodes one token, or several with
  // speculative decoding); each step's events stream the text and logits out here.
  std::vector<int32_t> argmax_tokens;  // with --force-tokens: the greedy pick at each forced step
  bool first_logits = true;
  auto on_step = [&](const loadgen::Step& st) -> Status {
    for (const engine::TokenEvent& ev : st.events) {  // the engine holds this one request only
      if (ev.finish == engine::FinishReason::kError) return errorf("%s", ev.error.c_str());
      if (!ev.tokens.empty()) {
        if (!ev.logits.empty()) {
          if (first_logits && !o.logits_out.empty()) PAGODA_TRY(write_f32_file(o.logits_out, ev.logits));
          if (all_logits && std::fwrite(ev.logits.data(), sizeof(float), ev.logits.size(), all_logits.get()) !=
                                ev.logits.size()) {
            return errorf("short write to %s", o.logits_out_all.c_str());
          }
        }
        first_logits = false;
        if (ev.argmax >= 0) argmax_tokens.push_back(ev.argmax);
      }
      emit(ev.text);
    }
    return Status::Ok();
  };
  auto stream = loadgen::run_one(eng, rp, on_step);
  if (!stream.ok()) return fail(stream.message());
  const std::vector<int32_t>& generated = stream->tokens;
  const engine::FinishReason finish = stream->finish;
  const int32_t kv_blocks = stream->num_kv_blocks;  // blocks the sequence held at its last step
  const double prefill_s = stream->prefill_s, decode_s = stream->decode_s;
  const int64_t decode_steps = stream->decode_steps;
  const int64_t decode_tokens = stream->decode_tokens;  // > decode_steps with speculative decoding

  const double prefill_tps = prefill_s > 0 ? static_cast<double>(n_prompt) / prefill_s : 0;
  const double decode_tps = decode_s > 0 ? static_cast<double>(decode_tokens) / decode_s : 0;
  const uint64_t kv_bytes = static_cast<uint64_t>(kv_blocks) * static_cast<uint64_t>(info.kv_bytes_per_block);
  if (o.json) {
    nlohmann::json j;
    j["model"] = o.model;
    j["prompt_tokens"] = *prompt;
    if (o.prompt_ids.empty()) j["prompt_text"] = prompt_text;
    j["generated_tokens"] = generated;
    if (!o.force_tokens.empty()) j["argmax_tokens"] = argmax_tokens;
    j["n_prompt_tokens"] = n_prompt;
    j["n_generated_tokens"] = generated.size();
    j["text"] = text;
    j["finish_reason"] = engine::finish_reason_name(finish);
    j["seed"] = o.sampling.seed;
    j["timings"] = {{"prefill_ms", prefill_s * 1e3},
                    {"decode_ms", decode_s * 1e3},
                    {"decode_steps", decode_steps},
                    {"decode_tokens", decode_tokens},
                    {"prefill_tokens_per_s", prefill_tps},
                    {"decode_tokens_per_s", decode_tps}};
    j["kv_bytes"] = kv_bytes;
    j["kv_dtype"] = kv_types_name(o.kv_dtype);
    j["kv_cache"] = !o.no_kv_cache;
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return 0;
  }
  // Tokens whose K/V the sequence holds: the last sampled token is never computed.
  const int64_t kv_tokens = n_prompt + static_cast<int64_t>(generated.size()) - (generated.empty() ? 0 : 1);
  std::printf("\n");
  std::fflush(stdout);
  std::fprintf(stderr, "\nprompt tokens: %" PRId64 ", generated tokens: %zu (%s), seed %" PRIu64 "\n", n_prompt,
               generated.size(), engine::finish_reason_name(finish), o.sampling.seed);
  std::fprintf(stderr, "prefill: %" PRId64 " tokens in %.2f ms, %.1f tok/s\n", n_prompt, prefill_s * 1e3, prefill_tps);
  std::fprintf(stderr, "decode:  %" PRId64 " tokens in %.2f ms, %.1f tok/s%s\n", decode_tokens, decode_s * 1e3, decode_tps,
               o.no_kv_cache ? " (no KV cache: recomputed every step)" : "");
  std::fprintf(stderr, "kv cache: %s held (%" PRId64 " tokens in %d blocks of %d, %s), %s reserved for %" PRId64 " tokens\n",
               human_bytes(static_cast<double>(kv_bytes)).c_str(), kv_tokens, kv_blocks, info.block_size,
               kv_types_name(o.kv_dtype).c_str(), human_bytes(static_cast<double>(info.kv_cache_bytes)).c_str(), ctx);
  return 0;
}

const Register kRegisterRun("run", "generate text from a prompt (one sequence, streaming)", run_run);

}  // namespace
}  // namespace pagoda::cli
