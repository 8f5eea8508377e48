// pagoda perplexity: llama-perplexity's measure of a model (and of its KV cache
// types) on a text file, with its flags, its algorithm and its output
// (docs/perplexity.md). The whole file is tokenized once (BOS as the vocabulary
// adds it, special-token text kept plain, one trailing newline dropped), cut
// into chunks of n_ctx tokens; the first token of each chunk becomes BOS when the
// model adds BOS, and only the second half of each chunk is scored: the logits
// at positions n_ctx/2 .. n_ctx-2 against the next token. It drives
// engine::Engine like `run`: each chunk is one request whose prompt is the
// chunk's first n_ctx/2 + 1 tokens and whose remaining tokens are forced
// (RequestParams::forced_tokens) with return_logits, so every scored row comes
// out of the engine's own decode path; max(1, -b / -c) chunks run at once.
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "base/kv_dtype.h"
#include "base/log.h"
#include "base/log_control.h"
#include "base/timer.h"
#include "cli/cli_util.h"
#include "cli/command.h"
#include "cli/engine_flags.h"
#include "engine/engine.h"
#include "loadgen/driver.h"
#include "tok/tokenizer.h"

namespace pagoda::cli {
namespace {

const char* kPerplexityUsage =
    "usage: pagoda perplexity [MODEL | -m MODEL] -f FILE [options]\n"
    "\n"
    "llama-perplexity's measure, flags and output: the file is tokenized whole and cut\n"
    "into chunks of -c tokens (the first of each replaced by BOS when the model adds BOS);\n"
    "the second half of each chunk is scored. Prints [i]PPL after each chunk, then\n"
    "`Final estimate: PPL = X +/- Y`.\n"
    "\n"
    "  -f, --file FILE       the text (one trailing newline is dropped, as llama.cpp does)\n"
    "  -c, --ctx-size N      tokens per chunk (default 512)\n"
    "      --chunks N        chunks to score (default -1: every whole chunk of the file)\n"
    "  -b, --batch-size N    tokens per step; max(1, N / -c) chunks run at once (default 2048;\n"
    "                        below -c or a multiple of it, as llama-perplexity requires)\n"
    "      --ppl-output-type 0|1  0: [i]PPL lines (default); 1: one line per chunk:\n"
    "                        offset, PPL, mean NLL, its standard error\n"
    "  -t, --threads N, -ctk/-ctv TYPE (K and V cache types), --kv-dtype TYPE, --ref-kernels\n"
    "                        and the other engine flags below\n\n";

struct PplOptions {
  std::string file;
  int64_t n_ctx = 512;
  int64_t n_chunks = -1;
  int64_t n_batch = 2048;
  int64_t output_type = 0;
};

int fail(const std::string& msg) {
  std::fprintf(stderr, "pagoda perplexity: %s\n", msg.c_str());
  return 1;
}

// llama-perplexity's log_softmax: the max in float, the sum of expf in double.
double log_softmax(const std::vector<float>& logits, int32_t tok) {
  float max_logit = logits[0];
  for (float v : logits) max_logit = std::max(max_logit, v);
  double sum_exp = 0.0;
  for (float v : logits) sum_exp += std::exp(v - max_logit);
  return static_cast<double>(logits[static_cast<size_t>(tok)] - max_logit) - std::log(sum_exp);
}

// One chunk in flight: the tokens it scores and the negative log-likelihoods so far.
struct Chunk {
  std::vector<int32_t> targets;  // chunk tokens first+1 .. n_ctx-1: what rows first .. n_ctx-2 predict
  std::vector<double> nll;       // one per scored row, in position order
  bool done = false;
};

int run_perplexity(int argc, char** argv) {
  Args args(argc, argv);
  if (args.version()) {
    std::printf("pagoda %s\n", version_string());
    return 0;
  }
  PplOptions o;
  engine::EngineConfig cfg;
  std::string err = parse_log_flags(args);
  if (err.empty()) err = parse_engine_flags(args, &cfg);
  if (err.empty() && args.flag("--ref-kernels")) cfg.ref_kernels = true;
  std::string v;
  if (err.empty() && !args.value("--file", &o.file, "-f") && !args.help()) err = "missing -f FILE";
  if (err.empty()) err = int_option(args, "--chunks", -1, 1 << 30, &o.n_chunks);
  if (err.empty() && args.value("--batch-size", &v, "-b") && !parse_int(v, 1, 1 << 24, &o.n_batch))
    err = "--batch-size must be a positive integer, got '" + v + "'";
  if (err.empty()) err = int_option(args, "--ppl-output-type", 0, 1, &o.output_type);
  if (err.empty()) err = finish_engine_flags(args, &cfg);
  if (const std::optional<int> rc = help_or_usage_error("perplexity", args.help(), err, kPerplexityUsage)) {
    if (args.help()) std::printf("%s", kEngineFlagsHelp);
    return *rc;
  }
  if (cfg.context_length > 0) o.n_ctx = cfg.context_length;
  if (o.n_ctx < 4) return fail("-c must be at least 4 tokens, got " + std::to_string(o.n_ctx));
  if (!(o.n_batch < o.n_ctx || o.n_batch % o.n_ctx == 0))
    return fail("-b " + std::to_string(o.n_batch) + " must be below -c " + std::to_string(o.n_ctx) +
                " or a multiple of it");
  const int64_t n_seq = std::max<int64_t>(1, o.n_batch / o.n_ctx);

  std::string text;
  if (!read_file(o.file, &text)) return fail("cannot read " + o.file);
  if (!text.empty() && text.back() == '\n') text.pop_back();

  // The engine: n_seq sequences of n_ctx tokens, -b tokens a step, nothing shared.
  cfg.context_length = static_cast<int>(o.n_ctx);
  cfg.max_num_seqs = static_cast<int>(n_seq);
  cfg.max_num_batched_tokens = static_cast<int>(std::min(o.n_batch, n_seq * o.n_ctx));
  cfg.auto_batched_tokens = false;
  cfg.enable_prefix_caching = false;
  cfg.watermark = 0;
  cfg.speculative = engine::SpeculativeConfig{};
  if (n_seq == 1 && !args.kv_size_given) cfg.kv_pool_one_context = true;
  auto created = engine::Engine::create(cfg);
  if (!created.ok()) return fail(cfg.model_path + ": " + created.message());
  engine::Engine& eng = **created;
  const engine::ModelInfo& info = eng.model_info();
  if (info.context_length < o.n_ctx)
    return fail("the KV pool holds " + std::to_string(info.context_length) + " tokens, less than -c " +
                std::to_string(o.n_ctx) + " (give --kv-cache-memory)");
  if (info.n_ctx_train > 0 && o.n_ctx > info.n_ctx_train)
    PAGODA_LOG_WARN("-c %" PRId64 " is beyond the model's training context of %d", o.n_ctx, info.n_ctx_train);

  const tok::Tokenizer& tk = eng.tokenizer();
  if (tk.add_eos()) return fail("the vocabulary appends EOS to every text; llama-perplexity refuses such models too");
  Timer t_tok;
  const std::vector<int32_t> tokens = tk.encode(text, /*add_special=*/true, /*parse_special=*/false);
  std::fprintf(stderr, "perplexity: tokenizing the input ..\nperplexity: tokenization took %g ms, %zu tokens\n",
               t_tok.seconds() * 1e3, tokens.size());
  const int64_t n_tokens = static_cast<int64_t>(tokens.size());
  if (n_tokens < 2 * o.n_ctx)
    return fail("you need at least " + std::to_string(2 * o.n_ctx) + " tokens to evaluate perplexity with a context of " +
                std::to_string(o.n_ctx) + "; " + o.file + " tokenizes to only " + std::to_string(n_tokens) + " tokens");
  const int64_t n_chunk_max = n_tokens / o.n_ctx;
  const int64_t n_chunk = o.n_chunks < 0 ? n_chunk_max : std::min(o.n_chunks, n_chunk_max);
  const int64_t first = o.n_ctx / 2;
  std::fprintf(stderr, "perplexity: calculating perplexity over %" PRId64 " chunks, n_ctx=%" PRId64
               ", batch_size=%" PRId64 ", n_seq=%" PRId64 ", K/V %s\n",
               n_chunk, o.n_ctx, o.n_batch, n_seq, kv_types_name(info.kv_dtype).c_str());

  // Every chunk is queued at once; the engine runs n_seq of them at a time, in order,
  // stepped by the load driver (loadgen/driver.h).
  loadgen::Driver drv(eng);
  std::vector<Chunk> chunks(static_cast<size_t>(n_chunk));
  std::map<engine::RequestId, size_t> chunk_of;
  for (int64_t i = 0; i < n_chunk; ++i) {
    const auto start = tokens.begin() + i * o.n_ctx;
    engine::RequestParams rp;
    rp.prompt.assign(start, start + first + 1);
    if (tk.add_bos()) rp.prompt[0] = tk.bos_id();
    Chunk& c = chunks[static_cast<size_t>(i)];
    c.targets.assign(start + first + 1, start + o.n_ctx);
    rp.forced_tokens = c.targets;
    rp.max_tokens = static_cast<int>(c.targets.size());
    rp.temperature = 0;
    rp.ignore_eos = true;
    rp.return_logits = true;
    auto id = drv.submit(rp);
    if (!id.ok()) return fail("chunk " + std::to_string(i + 1) + ": " + id.message());
    chunk_of[*id] = static_cast<size_t>(i);
  }

  // Running sums in chunk order, token by token (llama-perplexity's nll, nll2, count).
  double nll = 0, nll2 = 0;
  int64_t count = 0;
  size_t next_print = 0;
  Timer t_all;
  while (drv.has_unfinished()) {
    for (const engine::TokenEvent& ev : drv.step().events) {
      auto it = chunk_of.find(ev.id);
      if (it == chunk_of.end()) continue;
      Chunk& c = chunks[it->second];
      if (ev.finish == engine::FinishReason::kError) return fail("chunk " + std::to_string(it->second + 1) + ": " + ev.error);
      if (!ev.tokens.empty()) {
        if (ev.logits.size() != static_cast<size_t>(info.vocab_size) || ev.tokens.size() != 1)
          return fail("the engine returned no logits row for a forced token");
        const size_t k = c.nll.size();
        if (k >= c.targets.size() || ev.tokens[0] != c.targets[k]) return fail("the engine did not keep the forced token");
        c.nll.push_back(-log_softmax(ev.logits, c.targets[k]));
      }
      if (ev.finish != engine::FinishReason::kNone) c.done = true;
    }
    for (; next_print < chunks.size() && chunks[next_print].done; ++next_print) {
      const Chunk& c = chunks[next_print];
      if (c.nll.size() != c.targets.size()) return fail("chunk " + std::to_string(next_print + 1) + " ended early");
      for (double x : c.nll) {
        nll += x;
        nll2 += x * x;
      }
      count += static_cast<int64_t>(c.nll.size());
      if (next_print == 0)
        std::fprintf(stderr, "perplexity: %.2f seconds per pass - ETA %.2f minutes\n", t_all.seconds(),
                     t_all.seconds() * static_cast<double>(n_chunk) / static_cast<double>(n_seq) / 60.0);
      if (o.output_type == 0) {
        std::printf("[%zu]%.4lf,", next_print + 1, std::exp(nll / static_cast<double>(count)));
      } else {
        const double av = nll / static_cast<double>(count);
        double av2 = nll2 / static_cast<double>(count) - av * av;
        if (av2 > 0) av2 = std::sqrt(av2 / static_cast<double>(count - 1));
        std::printf("%8" PRId64 "  %.4lf  %4lf  %4lf\n", static_cast<int64_t>(next_print) * o.n_ctx,
                    std::exp(nll / static_cast<double>(count)), av, av2);
      }
      std::fflush(stdout);
      chunks[next_print].nll = {};
    }
  }
  std::printf("\n");
  if (next_print != chunks.size()) return fail("not every chunk finished");
  const double mean = nll / static_cast<double>(count);
  const double ppl = std::exp(mean);
  const double var = nll2 / static_cast<double>(count) - mean * mean;
  if (!(var > 0)) return fail("Unexpected negative standard deviation of log(prob)");
  std::printf("Final estimate: PPL = %.4lf +/- %.5lf\n", ppl, std::sqrt(var / static_cast<double>(count - 1)) * ppl);
  std::fflush(stdout);
  std::fprintf(stderr, "perplexity: %" PRId64 " tokens scored in %.2f s\n", count, t_all.seconds());
  return 0;
}

const Register kRegisterPerplexity("perplexity", "llama-perplexity's measure on a text file (-f, -c, --chunks, -b)",
                                   run_perplexity);

}  // namespace
}  // namespace pagoda::cli
