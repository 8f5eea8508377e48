#include "engine/engine.h"
#include "engine/finish.h"
#include "engine/kv_events_link.h"
#include "engine/kv_tiers.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <optional>
#include <unordered_map>

#include "base/check.h"
#include "base/log.h"
#include "base/rng.h"
#include "base/timer.h"
#include "engine/snapshot_fill.h"
#include "gguf/gguf.h"
#include "grammar/matcher.h"
#include "grammar/token_index.h"
#include "kernels/api.h"
#include "kv/kv_manager.h"
#include "kv/pool_plan.h"
#include "kv/sizing.h"
#include "model/model.h"
#include "runtime/model_runner.h"
#include "sample/sampler.h"
#include "sched/scheduler.h"
#include "tok/tokenizer.h"

namespace pagoda::engine {

namespace {

constexpr int64_t kDefaultKvCacheMemory = 256ll << 20;

// One sampled sequence of a request. n > 1 gives several: choice 0 is the
// scheduler request that prefills the prompt once; choices 1..n-1 are its
// fork ids, created by the scheduler when the prompt is computed (sharing all
// its KV blocks) and each sampling its first token from the same logits row.
// Seeds: choice i samples with seed base + i, where base is the request's
// seed (or one draw of the engine's seed stream when it has none); the RNG
// lives in the choice's sampler, so choice i of a seeded request gives the
// same tokens as a lone n = 1 request with seed base + i.
//
// A choice holds only what the engine adds to the scheduler's request: its
// token counts are the scheduler's (sched::Request::num_prompt_tokens and
// num_output_tokens(), plus the tokens emitted this step until update()).
struct Choice {
  RequestId parent = 0;
  int index = 0;
  bool reported_cached = false;
  bool scheduled = false;  // choice 0: counted in newly_scheduled() once
  sample::Sampler sampler;
  FinishRule finish;  // decides why the choice ends (engine/finish.h); holds its detokenizer and stop strings
  std::vector<int32_t> forced;  // teacher forcing: output i < forced.size() is forced[i]
  bool return_logits = false;
  // Structured output: the parse state of this choice's output. It lives with
  // the choice, not the KV blocks, so preemption (recompute) and prefix hits
  // leave it as it is; n > 1 choices each start from a copy of the start state.
  std::optional<grammar::Matcher> matcher;
  std::vector<uint32_t> mask;  // [mask_words] this step's allowed tokens
  bool mask_ready = false;     // filled by step()'s parallel pass for this step
  DraftThrottle throttle;      // speculative decoding: the adaptive off-switch
  AcceptanceEstimate acceptance;  // and the draft length that pays (best_draft_length)
  Choice(RequestId p, int i, const sample::SamplingParams& sp, const RequestParams& rp, const tok::Tokenizer& tk,
         int32_t context_length, const std::optional<grammar::Matcher>& start)
      : parent(p),
        index(i),
        sampler(sp, rp.prompt),
        finish(sp, tk, static_cast<int32_t>(rp.prompt.size()), context_length),
        forced(rp.forced_tokens),
        return_logits(rp.return_logits),
        matcher(start) {
    if (matcher) mask.resize(matcher->mask_words());
  }
};

class EngineImpl final : public Engine {
 public:
  Status init(const EngineConfig& c);
  Expected<RequestId> add_request(const RequestParams& params) override;
  void abort(RequestId id) override;
  std::vector<TokenEvent> step() override;
  bool has_unfinished() const override {
    return sched_->has_unfinished() || (tiers_ && tiers_->num_waiting() > 0);
  }
  const std::vector<RequestId>& newly_scheduled() const override { return newly_scheduled_; }
  EngineStats stats() const override;
  std::string check_invariants() const override { return sched_->check_invariants(); }
  const ModelInfo& model_info() const override { return info_; }
  const tok::Tokenizer& tokenizer() const override { return *tok_; }
  void snapshot(DashboardSnapshot* out, const SnapshotOptions& options) const override;
  std::vector<int32_t> cached_block_tokens(int32_t block) const override;
  std::string cached_block_salt(int32_t block) const override;
  std::vector<KvBlockKey> kv_block_keys(const SnapshotOptions& options) const override;
  using Engine::reset_prefix_cache;
  Status reset_prefix_cache(bool force, bool tiers, std::vector<std::pair<std::string, int64_t>>* cleared) override;
  double pin_ttl_left(int32_t block) const override;

 private:
  void fail_plan(const sched::StepPlan& plan, const std::string& msg, std::vector<TokenEvent>* events);
  // Queues the requests whose tier loads are back (blocks now in the prefix cache).
  void queue_loaded(std::vector<TokenEvent>* events);
  // The token masks of every constrained choice sampling in this step, computed
  // in parallel (each choice writes its own buffer; the grammar's context cache
  // is thread-safe, and a context met by several streams is computed once).
  void fill_masks(const sched::StepPlan& plan, const runtime::StepLogits& L);
  void sample_choice(sched::RequestId sid, const sched::ScheduledSeq& seq, std::span<const float> logits,
                     std::vector<TokenEvent>* events, std::unordered_map<sched::RequestId, size_t>* event_of,
                     std::vector<sched::SeqOutput>* outputs);
  // Speculative decoding: proposes drafts for the running choices about to
  // decode (Scheduler::set_draft), before schedule().
  void propose_drafts();
  // Verifies the drafts of `seq` against its rows first_row.. of L (one per
  // draft plus the bonus row) and emits the accepted tokens and one more.
  void verify_choice(const sched::ScheduledSeq& seq, const runtime::StepLogits& L, int32_t first_row,
                     std::vector<TokenEvent>* events, std::unordered_map<sched::RequestId, size_t>* event_of,
                     std::vector<sched::SeqOutput>* outputs);
  // Choice ch's event for slice `seq`, its counts those before this step: the
  // scheduler's request of the slice (a child forked in this step: its parent,
  // whose prompt it shares and which has no output yet).
  TokenEvent new_event(const Choice& ch, const sched::ScheduledSeq& seq) const;
  // Counts `token` as choice ch's next output (into ev, with the text it lets
  // show) and returns why the choice ends after it: ch.finish decides.
  FinishReason emit_token(Choice& ch, int32_t token, TokenEvent* ev);
  // Fills the event's other counts (cached prompt tokens once, KV blocks) and appends it.
  void push_event(sched::RequestId sid, const sched::ScheduledSeq& seq, Choice& ch, TokenEvent ev,
                  std::vector<TokenEvent>* events, std::unordered_map<sched::RequestId, size_t>* event_of);

  EngineConfig cfg_;
  std::shared_ptr<const gguf::GgufFile> file_;
  std::unique_ptr<model::Model> model_;
  std::unique_ptr<tok::Tokenizer> tok_;
  std::unique_ptr<runtime::ModelRunner> runner_;
  // KV events publisher (issue 37); nullptr: off. Declared before kv_: the
  // KvManager's sink outlives it.
  std::unique_ptr<KvEventLink> kv_events_;
  std::unique_ptr<kv::KvManager> kv_;
  std::unique_ptr<sched::Scheduler> sched_;
  std::unique_ptr<KvTierLink> tiers_;  // KV tiers below RAM; nullptr: none
  int64_t prefix_cache_resets_ = 0;
  sched::StepPlan recompute_plan_;  // cfg_.recompute: the step rewritten to start at position 0
  ModelInfo info_;
  Rng seed_rng_{0x5eed};
  uint64_t next_id_ = 1;
  std::vector<RequestId> newly_scheduled_;  // of the last step (newly_scheduled())
  std::unordered_map<sched::RequestId, Choice> choices_;             // scheduler id -> choice
  std::unordered_map<RequestId, std::vector<sched::RequestId>> requests_;  // request -> its choices
  int64_t prompt_tokens_total_ = 0;
  int64_t generation_tokens_total_ = 0;
  int64_t computed_tokens_total_ = 0;
  int64_t grammar_tokens_total_ = 0;
  int64_t grammar_mask_ns_total_ = 0;
  int64_t constrained_choices_ = 0;  // live choices with a grammar (0: step() skips the mask pass)
  int64_t spec_num_drafts_ = 0;
  int64_t spec_num_draft_tokens_ = 0;
  int64_t spec_num_accepted_tokens_ = 0;
  std::vector<int64_t> spec_accepted_per_pos_;  // [num_speculative_tokens]
  AcceptanceEstimate spec_recent_;  // over every verified draft: a new choice's starting estimate
};

Status EngineImpl::init(const EngineConfig& c) {
  cfg_ = c;
  if (c.block_size < 1 || c.block_size > 256)
    return errorf("block size must be in 1..256, got %d", c.block_size);
  if (c.threads < 1) return errorf("threads must be >= 1, got %d", c.threads);
  if (std::string e = check_speculative_config(c.speculative); !e.empty()) return errorf("speculative decoding: %s", e.c_str());
  if (c.auto_batched_tokens && !(c.auto_step_factor >= 1.0 && c.auto_step_factor <= 100.0))
    return errorf("the auto step-time factor must be in 1..100, got %g", c.auto_step_factor);
  if (c.auto_batched_tokens && c.auto_min_prefill_tokens < 1)
    return errorf("the auto minimum prefill chunk must be >= 1 token, got %d", c.auto_min_prefill_tokens);
  if (c.speculative.enabled() && c.recompute) return errorf("speculative decoding needs the KV cache (not with recompute)");
  spec_accepted_per_pos_.assign(static_cast<size_t>(c.speculative.num_speculative_tokens), 0);
  kernels::set_num_threads(c.threads);
  auto file = gguf::GgufFile::open(c.model_path);
  if (!file.ok()) return file.error();
  file_ = std::shared_ptr<const gguf::GgufFile>(std::move(file).value());
  PAGODA_ASSIGN_OR_RETURN(model_, model::Model::from_gguf(file_, {.context_length = c.context_length}));
  PAGODA_ASSIGN_OR_RETURN(tok_, tok::Tokenizer::from_gguf(*file_));
  const model::ModelConfig& mc = model_->config();

  // pagoda's storage keeps each token's K (and V) row of all KV heads as one
  // row of n_kv_heads x head_dim values (q8_0 quantizes across heads), so for
  // kv/sizing the cache is one "head" of that width per layer.
  const int64_t kv_dim = static_cast<int64_t>(mc.n_kv_heads) * mc.head_dim;
  for (KvDtype d : {c.kv_dtype.k, c.kv_dtype.v}) {
    if (kv_dtype_is_quantized(d) && kv_dim % 32 != 0)
      return errorf("KV cache type %s needs n_kv_heads x head_dim to be a multiple of 32 (this model: %lld)",
                    kv_dtype_name(d), static_cast<long long>(kv_dim));
  }
  kv::KvShape shape;
  shape.kind = kv::AttentionKind::kMQA;
  shape.num_layers = mc.n_layers - mc.n_recurrent_layers();  // the layers holding K/V (hybrid: not the recurrent ones)
  shape.num_kv_heads = 1;
  shape.head_dim = static_cast<int32_t>(kv_dim);
  const kv::KvDtype dtype_desc = kv::kv_dtype_of(c.kv_dtype);
  // KV cache groups by attention kind (one group with the flag): a block holds
  // group_size layer slots, so it costs the same in every group.
  std::vector<int32_t> layer_windows;
  for (const model::LayerAttn& a : mc.layers) layer_windows.push_back(a.recurrent ? kv::kStateWindow : a.window);
  // Hybrid models: a recurrent state cannot roll back (speculative decoding);
  // prefix hits restore it from state checkpoints (which the KV tiers keep too).
  const bool recurrent = mc.n_state_rows > 0;
  if (c.state_checkpoint_interval < 0 || c.state_checkpoint_interval > (1 << 20))
    return errorf("--state-checkpoint-interval must be an integer in 0..%d (blocks between state checkpoints; 0: off), got %d",
                  1 << 20, c.state_checkpoint_interval);
  if (recurrent && c.speculative.enabled())
    return errorf("speculative decoding is not supported for %s: its recurrent state cannot roll back rejected drafts", mc.arch.c_str());
  // Recompute rewrites every position each step: it needs every block, so one full group.
  // Tiers store one entry per block per group (engine/kv_tiers.h).
  const bool tiers = kv_tiers_enabled(c);
  if (tiers && recurrent && c.state_checkpoint_interval == 0)
    return errorf("KV tiers (--kv-disk-dir, --kv-redis) for %s need state checkpoints (--state-checkpoint-interval > 0): "
                  "without them its prefix cache is off and a tier could serve no hit", mc.arch.c_str());
  if (tiers && (c.recompute || !c.enable_prefix_caching))
    return errorf("KV tiers (--kv-disk-dir, --kv-redis) need prefix caching and the KV cache (no recompute)");
  // The one pool plan (kv::plan_pool) both the runner's storage and the KvManager are built from.
  kv::PoolRequest pr;
  pr.shape = shape;
  pr.dtype = dtype_desc;
  pr.layer_windows = std::move(layer_windows);
  pr.state_rows = mc.n_state_rows;
  pr.state_row_bytes = static_cast<uint64_t>(mc.state_row_floats) * sizeof(float);
  pr.hybrid = !c.disable_hybrid_kv_cache_manager && !c.recompute;
  pr.block_size = c.block_size;
  pr.max_chunk = std::max(1, c.max_num_batched_tokens);
  int64_t ctx = c.context_length > 0 ? c.context_length : (mc.n_ctx_train > 0 ? mc.n_ctx_train : 2048);
  if (c.kv_pool_one_context) {
    pr.one_context_tokens = ctx;
  } else {
    pr.num_blocks = c.num_kv_blocks;
    pr.budget_bytes = static_cast<uint64_t>(c.kv_cache_memory > 0 ? c.kv_cache_memory : kDefaultKvCacheMemory);
  }
  PAGODA_ASSIGN_OR_RETURN(const kv::PoolPlan pool, kv::plan_pool(pr));
  const kv::KvGroupLayout& layout = pool.layout;
  if (ctx > pool.max_tokens) {
    PAGODA_LOG_WARN("context %lld capped to the KV pool's %lld tokens", static_cast<long long>(ctx),
                    static_cast<long long>(pool.max_tokens));
    ctx = pool.max_tokens;
  }

  runtime::RunnerOptions ro;
  ro.use_pool(pool);
  ro.kv_dtype = c.kv_dtype;
  ro.max_tokens_per_step = c.max_num_batched_tokens;
  ro.backend = c.ref_kernels ? model::KernelBackend::Ref : model::KernelBackend::Cpu;
  PAGODA_ASSIGN_OR_RETURN(runner_, runtime::ModelRunner::create(*model_, ro));

  kv::KvConfig kc = kv::KvConfig::from_plan(pool);
  kc.watermark = c.watermark;
  kc.model_fingerprint = model_->fingerprint();
  // Recomputing rewrites a sequence's blocks every step: none may be shared.
  kc.enable_prefix_caching = c.enable_prefix_caching && !c.recompute;
  if (!(c.kv_pinned_fraction >= 0.0 && c.kv_pinned_fraction <= 1.0))
    return errorf("--kv-pinned-fraction must be in [0, 1], got %g", c.kv_pinned_fraction);
  kc.pinned_fraction = c.kv_pinned_fraction;
  kc.state_checkpoint_interval = c.state_checkpoint_interval;
  if (c.scheduling_policy == "priority") kc.eviction_classes = sched::kNumEvictionClasses;
  kv_ = std::make_unique<kv::KvManager>(kc);
  if (recurrent) {
    if (kv_->checkpoint_tokens() > 0) {
      PAGODA_LOG_INFO("%s: recurrent state of %d layers in %d KV blocks per sequence; prefix caching through state "
                      "checkpoints every %d tokens (--state-checkpoint-interval %d blocks)",
                      mc.arch.c_str(), mc.n_recurrent_layers(), layout.state_blocks, kv_->checkpoint_tokens(),
                      c.state_checkpoint_interval);
    } else {
      PAGODA_LOG_INFO("%s: recurrent state of %d layers in %d KV blocks per sequence; prefix caching off (%s)",
                      mc.arch.c_str(), mc.n_recurrent_layers(), layout.state_blocks,
                      kc.enable_prefix_caching ? "--state-checkpoint-interval 0" : "prefix caching disabled");
    }
  }
  if (c.kv_clock_for_testing) kv_->set_clock(c.kv_clock_for_testing);

  sched::SchedulerConfig sc;
  sc.max_num_batched_tokens = c.max_num_batched_tokens;
  sc.max_num_seqs = c.max_num_seqs;
  sc.max_model_len = static_cast<int32_t>(ctx);
  sc.vocab_size = mc.n_vocab;
  sc.policy = c.schedule_lpm ? sched::SchedulePolicy::kLpm : sched::SchedulePolicy::kFcfs;
  if (c.scheduling_policy == "priority") {
    if (c.schedule_lpm) return errorf("--scheduling-policy priority and lpm cannot be combined");
    sc.policy = sched::SchedulePolicy::kPriority;
  } else if (c.scheduling_policy == "lpm") {
    sc.policy = sched::SchedulePolicy::kLpm;
  } else if (c.scheduling_policy != "fcfs") {
    return errorf("--scheduling-policy must be fcfs, priority or lpm, got '%s'", c.scheduling_policy.c_str());
  }
  sc.auto_budget = c.auto_batched_tokens;
  sc.auto_budget_config.target_factor = c.auto_step_factor;
  sc.auto_budget_config.min_prefill_tokens = c.auto_min_prefill_tokens;
  PAGODA_ASSIGN_OR_RETURN(kv_events_, KvEventLink::create(c.kv_events_config, kc.block_size));
  if (kv_events_) {
    kv_->set_event_sink(kv_events_.get());
    kv_events_->all_cleared();  // a subscriber forgets what an earlier run of this engine held
    kv_events_->flush();
  }
  sched_ = std::make_unique<sched::Scheduler>(sc, kv_.get());
  if (tiers) {
    PAGODA_ASSIGN_OR_RETURN(tiers_, KvTierLink::create(c, tier_model_fingerprint(*file_, model_->fingerprint()),
                                                       kv_.get(), &runner_->kv()));
    if (kv_events_) {  // start-up re-announce: BlockStored(disk) for the entries the disk tier holds
      tiers_->set_event_link(kv_events_.get());
      tiers_->poll_events();
      kv_events_->flush();
    }
  }

  info_.name = std::filesystem::path(c.model_path).stem().string();
  info_.architecture = file_->get_string_or("general.architecture", "llama");
  info_.context_length = static_cast<int>(ctx);
  info_.vocab_size = mc.n_vocab;
  info_.n_ctx_train = mc.n_ctx_train;
  info_.n_layers = mc.n_layers;
  info_.n_embd = mc.n_embd;
  info_.weight_bytes_per_token = model_->weight_bytes_per_token();
  info_.isa = kernels::cpu::isa_name();
  info_.kv_dtype = c.kv_dtype;
  info_.kv_bytes_per_token = static_cast<int64_t>(kv::kv_bytes_per_token(shape, dtype_desc));
  info_.kv_bytes_per_block = static_cast<int64_t>(pool.block_bytes);
  info_.num_kv_blocks = pool.num_blocks;
  info_.block_size = c.block_size;
  info_.kv_group_size = layout.group_size;
  info_.kv_group_windows.assign(layout.windows.begin(), layout.windows.end());
  info_.kv_blocks_per_context = kv::kv_blocks_for_sequence(layout, ctx, c.block_size);  // decoding: window + one block
  info_.kv_cache_tokens = pool.max_tokens;
  info_.kv_cache_bytes = static_cast<int64_t>(runner_->kv().bytes_total());
  return Status::Ok();
}

Expected<RequestId> EngineImpl::add_request(const RequestParams& p) {
  // The scheduler validates the prompt (empty, token ids, max_tokens, context
  // length, what the pool can ever admit); the engine only what it adds itself.
  for (int32_t t : p.forced_tokens)
    if (t < 0 || t >= info_.vocab_size)
      return errorf("forced token id %d is outside the vocabulary (size %d)", t, info_.vocab_size);
  for (const auto& [t, bias] : p.logit_bias)
    if (t < 0 || t >= info_.vocab_size)
      return errorf("logit_bias token id %d is outside the vocabulary (size %d)", t, info_.vocab_size);
  if (p.n < 1 || p.n > 64) return errorf("n must be in 1..64, got %d", p.n);
  if (cfg_.recompute && p.n != 1) return errorf("n = %d needs the KV cache (the engine recomputes: n must be 1)", p.n);
  if (!p.forced_tokens.empty() && p.logprobs >= 0) return errorf("forced tokens come without logprobs");
  if (p.grammar) {
    if (!p.forced_tokens.empty()) return errorf("forced tokens come without a grammar constraint");
    const grammar::TokenIndex& ti = p.grammar->index();
    if (ti.vocab_size() != tok_->vocab_size() || ti.vocab_size() > info_.vocab_size)
      return errorf("the grammar was built for a vocabulary of %d tokens; this model's tokenizer has %d",
                    ti.vocab_size(), tok_->vocab_size());
  }

  sample::SamplingParams sp;
  sp.temperature = p.temperature;
  sp.top_k = p.top_k;
  sp.top_p = p.top_p;
  sp.min_p = p.min_p;
  sp.repetition_penalty = p.repetition_penalty;
  sp.presence_penalty = p.presence_penalty;
  sp.frequency_penalty = p.frequency_penalty;
  sp.max_tokens = p.max_tokens;  // checked by the scheduler (>= 1, fits the context); ends with "length"
  sp.stop = p.stop;
  sp.ignore_eos = p.ignore_eos;
  sp.logprobs = p.logprobs >= 0;
  sp.top_logprobs = std::max(0, p.logprobs);
  sp.logit_bias = p.logit_bias;
  // Queue the request first; only when it is accepted draw the seed and commit
  // ids, so a refused request leaves the engine exactly as it was.
  const RequestId id = next_id_;
  std::vector<sched::RequestId> subs;  // scheduler ids of choices 0..n-1
  for (int i = 0; i < p.n; ++i) subs.push_back(id + 1 + static_cast<uint64_t>(i));
  sched::NewRequest nr;
  nr.id = subs[0];
  nr.prompt = p.prompt;
  nr.max_tokens = p.max_tokens;
  nr.cache_salt = p.cache_salt;
  if (p.pin_tokens < 0) return errorf("pin_tokens must be >= 0, got %d", p.pin_tokens);
  if (p.pin_tokens > 0 && !(p.pin_ttl_s > 0)) return errorf("a pin needs a TTL > 0 seconds, got %g", p.pin_ttl_s);
  nr.priority = sched_->config().policy == sched::SchedulePolicy::kPriority ? p.priority : 0;
  nr.pin_tokens = p.pin_tokens;
  nr.pin_ttl_s = p.pin_ttl_s;
  nr.fork_ids.assign(subs.begin() + 1, subs.end());
  if (tiers_) {
    // Checked now, queued once its tier loads are back (or at once: nothing to load).
    PAGODA_TRY(sched_->check_request(nr));
    if (!tiers_->start(nr)) PAGODA_TRY(sched_->add_request(std::move(nr)));
  } else {
    PAGODA_TRY(sched_->add_request(std::move(nr)));
  }
  next_id_ += 1 + static_cast<uint64_t>(p.n);
  const uint64_t base_seed = p.has_seed ? p.seed : seed_rng_.next_u64();
  std::optional<grammar::Matcher> start;
  if (p.grammar) start.emplace(p.grammar);
  for (int i = 0; i < p.n; ++i) {
    sample::SamplingParams spi = sp;
    spi.seed = base_seed + static_cast<uint64_t>(i);
    choices_.emplace(std::piecewise_construct, std::forward_as_tuple(subs[static_cast<size_t>(i)]),
                     std::forward_as_tuple(id, i, spi, p, *tok_, info_.context_length, start));
    // A new sequence's first drafts are sized by what recent sequences accepted
    // (the workload's rate), not the fixed prior: short outputs gain from step one.
    choices_.at(subs[static_cast<size_t>(i)]).acceptance = spec_recent_;
  }
  requests_[id] = std::move(subs);
  if (p.grammar) constrained_choices_ += p.n;
  prompt_tokens_total_ += static_cast<int64_t>(p.prompt.size()) * p.n;
  return id;
}

void EngineImpl::abort(RequestId id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  for (auto sid : it->second) {
    sched_->abort(sid);
    if (tiers_) tiers_->abort(sid);
    auto cit = choices_.find(sid);
    if (cit == choices_.end()) continue;
    if (cit->second.matcher) --constrained_choices_;
    choices_.erase(cit);
  }
  requests_.erase(it);
}

void EngineImpl::fail_plan(const sched::StepPlan& plan, const std::string& msg, std::vector<TokenEvent>* events) {
  std::vector<RequestId> parents;
  for (const auto& s : plan.seqs) {
    auto it = choices_.find(s.request_id);
    if (it != choices_.end()) parents.push_back(it->second.parent);
  }
  std::sort(parents.begin(), parents.end());
  parents.erase(std::unique(parents.begin(), parents.end()), parents.end());
  for (RequestId p : parents) {
    TokenEvent ev;
    ev.id = p;
    ev.finish = FinishReason::kError;
    ev.error = msg;
    events->push_back(ev);
    abort(p);
  }
}

void EngineImpl::queue_loaded(std::vector<TokenEvent>* events) {
  for (sched::NewRequest& nr : tiers_->take_ready()) {
    const sched::RequestId sid = nr.id;
    Status st = sched_->add_request(std::move(nr));
    if (st.ok()) continue;
    // Checked at add_request against the same config and pool: cannot happen,
    // but an accepted request still ends with an answer.
    auto cit = choices_.find(sid);
    if (cit == choices_.end()) continue;
    TokenEvent ev;
    ev.id = cit->second.parent;
    ev.finish = FinishReason::kError;
    ev.error = st.message();
    events->push_back(ev);
    abort(ev.id);
  }
}

void EngineImpl::fill_masks(const sched::StepPlan& plan, const runtime::StepLogits& L) {
  if (constrained_choices_ < 2) return;  // unconstrained serving pays nothing here
  std::vector<Choice*> todo;
  for (int32_t i = 0; i < L.size(); ++i) {
    const sched::ScheduledSeq& seq = plan.seqs[static_cast<size_t>(L.seq_indices[static_cast<size_t>(i)])];
    for (size_t k = 0; k <= seq.fork_ids.size(); ++k) {
      auto cit = choices_.find(k == 0 ? seq.request_id : seq.fork_ids[k - 1]);
      if (cit != choices_.end() && cit->second.matcher) todo.push_back(&cit->second);
    }
  }
  if (todo.size() < 2) return;  // one choice: sample_choice fills it, no thread start-up
  const auto t0 = std::chrono::steady_clock::now();
  const int n = static_cast<int>(todo.size());
  kernels::parallel_for(n, [&](int64_t i) {
    Choice* ch = todo[static_cast<size_t>(i)];
    ch->matcher->fill_mask(ch->mask);
    ch->mask_ready = true;
  });
  grammar_mask_ns_total_ +=
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
}

// Samples choice `sid` from `logits`, the row of scheduled sequence `seq`
// (sid itself, or its parent when sid is forked in this step).
void EngineImpl::sample_choice(sched::RequestId sid, const sched::ScheduledSeq& seq, std::span<const float> logits,
                               std::vector<TokenEvent>* events,
                               std::unordered_map<sched::RequestId, size_t>* event_of,
                               std::vector<sched::SeqOutput>* outputs) {
  auto cit = choices_.find(sid);
  if (cit == choices_.end()) return;
  Choice& ch = cit->second;
  TokenEvent ev = new_event(ch, seq);
  int32_t token = 0;
  if (static_cast<size_t>(ev.num_output_tokens) < ch.forced.size()) {
    token = ch.forced[static_cast<size_t>(ev.num_output_tokens)];
    ev.argmax = sample::argmax(logits);
    ch.sampler.accept(token);
  } else if (ch.matcher) {
    if (!ch.mask_ready) {
      const auto t0 = std::chrono::steady_clock::now();
      ch.matcher->fill_mask(ch.mask);
      grammar_mask_ns_total_ +=
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
    }
    ch.mask_ready = false;
    if (!sample::mask_allows_any(ch.mask, logits.size())) {
      // The vocabulary cannot spell any continuation (a grammar needing bytes no
      // token has): end the choice rather than emit an invalid token.
      ev.error = "the output constraint allows no token of the vocabulary here";
      (*event_of)[sid] = events->size();
      events->push_back(std::move(ev));
      outputs->push_back({sid, -1, FinishReason::kError, {}});
      return;
    }
    sample::SampleResult r = ch.sampler.sample(logits, ch.mask);
    grammar_tokens_total_++;
    token = r.token;
    // The mask allowed it, so the matcher takes it (checked: a failure is a bug).
    const bool accepted = ch.matcher->accept(token);
    PAGODA_CHECK_MSG(accepted, "grammar: a masked-in token was refused");
    if (ch.sampler.params().logprobs) ev.logprobs.push_back(std::move(r));
  } else {
    sample::SampleResult r = ch.sampler.sample(logits);
    token = r.token;
    if (ch.sampler.params().logprobs) ev.logprobs.push_back(std::move(r));
  }
  const FinishReason finish = emit_token(ch, token, &ev);
  if (ch.return_logits) ev.logits.assign(logits.begin(), logits.end());
  push_event(sid, seq, ch, std::move(ev), events, event_of);
  outputs->push_back({sid, token, finish, {}});
}

TokenEvent EngineImpl::new_event(const Choice& ch, const sched::ScheduledSeq& seq) const {
  TokenEvent ev;
  ev.id = ch.parent;
  ev.index = ch.index;
  if (const sched::Request* req = sched_->find(seq.request_id)) {  // cannot be null: the slice's own request
    ev.num_prompt_tokens = req->num_prompt_tokens;
    ev.num_output_tokens = req->num_output_tokens();
  }
  return ev;
}

FinishReason EngineImpl::emit_token(Choice& ch, int32_t token, TokenEvent* ev) {
  ev->num_output_tokens++;
  generation_tokens_total_++;
  ev->tokens.push_back(token);
  return ch.finish.accept(token, ev->num_output_tokens, ch.matcher && ch.matcher->is_finished(), &ev->text);
}

void EngineImpl::push_event(sched::RequestId sid, const sched::ScheduledSeq& seq, Choice& ch, TokenEvent ev,
                            std::vector<TokenEvent>* events,
                            std::unordered_map<sched::RequestId, size_t>* event_of) {
  if (!ch.reported_cached) {
    const sched::Request* req = sched_->find(seq.request_id);  // a child is not forked yet: its parent's
    ev.num_cached_tokens = req && req->num_cached_tokens > 0 ? req->num_cached_tokens : 0;
    if (req) {
      ev.prefix_miss = kv::miss_cause_name(req->prefix_miss.cause);
      ev.prefix_miss_position = req->prefix_miss.position;
      ev.prefix_evicted_ago_s = req->prefix_miss.evicted_ago_s;
    }
    ch.reported_cached = true;
  }
  // Every group's real blocks (window groups hold the null block 0 before their window).
  ev.num_kv_blocks = 0;
  for (sched::BlockId b : seq.block_ids) ev.num_kv_blocks += b != 0 ? 1 : 0;
  for (const auto& t : seq.group_block_ids) {
    for (sched::BlockId b : t) ev.num_kv_blocks += b != 0 ? 1 : 0;
  }
  (*event_of)[sid] = events->size();
  events->push_back(std::move(ev));
}

void EngineImpl::propose_drafts() {
  const SpeculativeConfig& sc = cfg_.speculative;
  // Decodes this step, for the cost of adding draft tokens to it.
  int batch = 0;
  for (sched::RequestId sid : sched_->running_ids()) {
    const sched::Request* r = sched_->find(sid);
    batch += r && sched_->num_computed_tokens(sid) == r->num_tokens() - 1 ? 1 : 0;
  }
  for (sched::RequestId sid : sched_->running_ids()) {
    auto cit = choices_.find(sid);
    if (cit == choices_.end()) continue;
    Choice& ch = cit->second;
    // Verification samples each position like sample_choice would, without a
    // mask, logprobs or a logits copy: such choices decode one token a step.
    const sched::Request* r = sched_->find(sid);
    if (!r || ch.matcher || ch.sampler.params().logprobs || ch.return_logits ||
        static_cast<size_t>(r->num_output_tokens()) < ch.forced.size())
      continue;
    if (sched_->num_computed_tokens(sid) != r->num_tokens() - 1) continue;  // not a decode
    if (!ch.throttle.should_draft()) continue;
    std::vector<int32_t> draft =
        ngram_propose(r->tokens, sc.prompt_lookup_min, sc.prompt_lookup_max, sc.num_speculative_tokens);
    if (draft.empty()) continue;
    // Only as many tokens as are expected to pay for their share of the step.
    const int k = sc.adaptive_length
                      ? best_draft_length(sched_->step_cost(), ch.acceptance.alpha(), batch, static_cast<int>(draft.size()))
                      : static_cast<int>(draft.size());
    if (k == 0) {
      ch.acceptance.decay();
      continue;
    }
    draft.resize(static_cast<size_t>(k));
    sched_->set_draft(sid, draft);
  }
}

void EngineImpl::verify_choice(const sched::ScheduledSeq& seq, const runtime::StepLogits& L, int32_t first_row,
                               std::vector<TokenEvent>* events,
                               std::unordered_map<sched::RequestId, size_t>* event_of,
                               std::vector<sched::SeqOutput>* outputs) {
  const sched::RequestId sid = seq.request_id;
  auto cit = choices_.find(sid);
  if (cit == choices_.end()) return;
  Choice& ch = cit->second;
  const auto k = static_cast<size_t>(seq.num_draft_tokens);
  const auto drafts = std::span<const int32_t>(seq.token_ids).last(k);
  TokenEvent ev = new_event(ch, seq);
  sched::SeqOutput out{sid, -1, FinishReason::kNone, {}};
  int accepted = 0;
  // Row j holds the logits after drafts[0..j): exactly a one-token decode's
  // (batch-invariant kernels), so each pick is what plain decoding picks.
  for (size_t j = 0; j <= k; ++j) {
    const std::span<const float> logits = L.row(first_row + static_cast<int32_t>(j));
    bool ok = false;
    int32_t token = 0;
    if (j < k) {
      const sample::Sampler::VerifyResult v = ch.sampler.verify(logits, drafts[j]);
      token = v.token;
      ok = v.accepted;
    } else {
      token = ch.sampler.sample(logits).token;  // the bonus token after every draft was taken
    }
    if (ok) {
      ++accepted;
      ++spec_accepted_per_pos_[j];
    }
    out.finish = emit_token(ch, token, &ev);
    if (!ok || out.finish != FinishReason::kNone || j == k) {
      out.token = token;
      break;
    }
    out.accepted.push_back(token);
  }
  ++spec_num_drafts_;
  spec_num_draft_tokens_ += static_cast<int64_t>(k);
  spec_num_accepted_tokens_ += accepted;
  ch.throttle.record(static_cast<int>(k), accepted);
  ch.acceptance.record(static_cast<int>(k), accepted);
  spec_recent_.record(static_cast<int>(k), accepted);
  push_event(sid, seq, ch, std::move(ev), events, event_of);
  outputs->push_back(std::move(out));
}

std::vector<TokenEvent> EngineImpl::step() {
  // This step's KV events go to the publisher as one message when the step ends, whatever path it takes.
  struct FlushEvents {
    KvEventLink* link;
    ~FlushEvents() {
      if (link) link->flush();
    }
  } flush_events{kv_events_.get()};
  std::vector<TokenEvent> events;
  if (tiers_ && kv_events_) tiers_->poll_events();  // the tiers' stores and drops since the last step
  if (tiers_) queue_loaded(&events);
  if (cfg_.speculative.enabled()) propose_drafts();
  sched::StepPlan plan = sched_->schedule();
  newly_scheduled_.clear();
  for (const sched::ScheduledSeq& q : plan.seqs) {
    auto cit = choices_.find(q.request_id);
    if (cit == choices_.end() || cit->second.index != 0 || cit->second.scheduled) continue;
    cit->second.scheduled = true;
    newly_scheduled_.push_back(cit->second.parent);
  }
  if (plan.seqs.empty()) {
    // Only requests waiting for tier loads: wait for one rather than spin.
    if (tiers_ && tiers_->num_waiting() > 0) tiers_->wait(std::chrono::milliseconds(2));
    return events;
  }
  if (cfg_.recompute) {
    // Every sequence again from position 0 (its K/V rewritten into the same,
    // unshared blocks). The scheduler's plan stays as it was for update().
    recompute_plan_ = plan;
    for (sched::ScheduledSeq& q : recompute_plan_.seqs) {
      const sched::Request* r = sched_->find(q.request_id);
      const size_t end = static_cast<size_t>(q.start_pos) + q.token_ids.size();
      if (!r || r->tokens.size() < end) continue;  // cannot happen: the scheduler's own request
      q.token_ids.assign(r->tokens.begin(), r->tokens.begin() + static_cast<std::ptrdiff_t>(end));
      q.start_pos = 0;
    }
  }
  const sched::StepPlan& run_plan = cfg_.recompute ? recompute_plan_ : plan;
  const auto t_forward = std::chrono::steady_clock::now();
  auto logits = runner_->execute(run_plan);
  sched_->record_step_time(run_plan.num_tokens(),
                           std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_forward).count());
  if (!logits.ok()) {
    PAGODA_LOG_ERROR("forward pass failed: %s", logits.message().c_str());
    fail_plan(plan, "forward pass failed: " + logits.message(), &events);
    return events;
  }
  computed_tokens_total_ += run_plan.num_tokens();
  const runtime::StepLogits& L = *logits;
  std::vector<sched::SeqOutput> outputs;
  outputs.reserve(static_cast<size_t>(L.size()));
  std::unordered_map<sched::RequestId, size_t> event_of;  // scheduler id -> index in events
  fill_masks(plan, L);
  for (int32_t i = 0; i < L.size(); ++i) {
    const sched::ScheduledSeq& seq = plan.seqs[static_cast<size_t>(L.seq_indices[static_cast<size_t>(i)])];
    if (seq.num_draft_tokens > 0) {  // its rows i .. i + k, in order
      verify_choice(seq, L, i, &events, &event_of, &outputs);
      i += seq.num_draft_tokens;
      continue;
    }
    // The request itself, then the children it forks into at the end of its prompt.
    for (size_t k = 0; k <= seq.fork_ids.size(); ++k) {
      const sched::RequestId sid = k == 0 ? seq.request_id : seq.fork_ids[k - 1];
      sample_choice(sid, seq, L.row(i), &events, &event_of, &outputs);
    }
  }
  std::vector<sched::FinishedRequest> finished = sched_->update(plan, outputs);
  // State checkpoints taken at this step's boundaries: copied before any block is taken again.
  kv_->flush_checkpoints([this](kv::BlockId src, kv::BlockId dst) { runner_->kv().copy_block(src, dst); });
  if (tiers_) tiers_->store_committed();  // before the next step's allocations reuse a block
  for (const auto& f : finished) {
    auto cit = choices_.find(f.id);
    if (cit == choices_.end()) continue;
    Choice& ch = cit->second;
    // The scheduler ended it as this step's output said (SeqOutput::finish), so
    // its event is this step's.
    auto eit = event_of.find(f.id);
    PAGODA_CHECK_MSG(eit != event_of.end(), "choice %llu finished without an output this step",
                     static_cast<unsigned long long>(f.id));
    TokenEvent& ev = events[eit->second];
    ev.text += ch.finish.flush();
    ev.finish = f.reason;
    const RequestId parent = ch.parent;
    if (ch.matcher) --constrained_choices_;
    choices_.erase(cit);
    auto rit = requests_.find(parent);
    if (rit != requests_.end()) {
      auto& subs = rit->second;
      subs.erase(std::remove(subs.begin(), subs.end(), f.id), subs.end());
      if (subs.empty()) requests_.erase(rit);
    }
  }
  return events;
}

EngineStats EngineImpl::stats() const {
  EngineStats s;
  s.num_running = sched_->num_running();
  s.num_waiting = sched_->num_waiting();
  kv::KvStats k = kv_->stats();
  s.blocks_total = k.num_blocks_total;
  s.blocks_free = k.num_free;
  s.blocks_used = k.num_used;
  s.group_blocks_used.assign(k.group_blocks_used.begin(), k.group_blocks_used.end());
  s.blocks_cached = k.num_cached_evictable;
  s.kv_usage = k.num_blocks_total > 0 ? static_cast<double>(k.num_used) / k.num_blocks_total : 0.0;
  s.prefix_queries_tokens = k.prefix_query_tokens;
  s.prefix_hits_tokens = k.prefix_hit_tokens;
  s.checkpoints = k.num_checkpoints;
  s.checkpoints_stored = k.checkpoints_stored;
  s.checkpoints_hit = k.checkpoints_hit;
  s.checkpoints_evicted = k.checkpoints_evicted;
  s.num_preemptions = sched_->stats().num_preemptions;
  s.prompt_tokens_total = prompt_tokens_total_;
  s.generation_tokens_total = generation_tokens_total_;
  s.computed_tokens_total = computed_tokens_total_;
  s.grammar_tokens_total = grammar_tokens_total_;
  s.grammar_mask_ns_total = grammar_mask_ns_total_;
  if (tiers_) {
    s.num_waiting_for_kv_load = tiers_->num_waiting();
    s.num_waiting += s.num_waiting_for_kv_load;
    s.kv_tiers = tiers_->stats();
  }
  if (kv_events_) {
    const kv_events::PublisherStats p = kv_events_->stats();
    s.kv_events_batches = p.batches_published;
    s.kv_events_events = p.events_published;
    s.kv_events_dropped_batches = p.batches_dropped;
    s.kv_events_dropped_events = p.events_dropped;
  }
  s.spec_num_drafts = spec_num_drafts_;
  s.spec_num_draft_tokens = spec_num_draft_tokens_;
  s.spec_num_accepted_tokens = spec_num_accepted_tokens_;
  s.spec_accepted_per_pos = spec_accepted_per_pos_;
  const kv::KvManager::PinStats ps = kv_->pin_stats();
  s.pins = ps.num_pins;
  s.blocks_pinned = ps.num_pinned_blocks;
  s.blocks_pinned_cap = ps.cap_blocks;
  s.pins_created = ps.created;
  s.pins_renewed = ps.renewed;
  s.pins_expired = ps.expired;
  s.pins_demoted = ps.demoted;
  s.pins_cleared = ps.cleared;
  s.pins_checkpoints_added = ps.checkpoints_added;
  s.pins_checkpoints_over_cap = ps.checkpoints_over_cap;
  s.prefix_cache_resets = prefix_cache_resets_;
  sched_->count_by_priority(&s.waiting_by_priority, &s.running_by_priority);
  return s;
}

Status EngineImpl::reset_prefix_cache(bool force, bool tiers,
                                      std::vector<std::pair<std::string, int64_t>>* cleared) {
  if (sched_->num_running() > 0) {
    if (!force) {
      return errorf("%d requests are running: the prefix cache can be reset only when none runs (force=true "
                    "preempts them; they recompute and complete)",
                    sched_->num_running());
    }
    sched_->preempt_all();
  }
  // KV events: the tiers' BlockRemoved before the RAM cache's AllBlocksCleared
  // (which a subscriber applies to every medium); without tiers, what they
  // still hold is announced again after it.
  if (tiers && tiers_) {
    auto n = tiers_->clear_tiers();
    if (cleared) *cleared = std::move(n);
  }
  const bool ok = kv_->reset_prefix_cache();
  PAGODA_CHECK_MSG(ok, "reset_prefix_cache: sequences still hold blocks after preempting every request");
  if (!tiers && tiers_) tiers_->reannounce();
  ++prefix_cache_resets_;
  return Status::Ok();
}

double EngineImpl::pin_ttl_left(int32_t block) const {
  const double expiry = kv_->pin_expiry(block);
  return expiry > 0 ? std::max(0.0, expiry - kv_->now()) : 0.0;
}

void EngineImpl::snapshot(DashboardSnapshot* out, const SnapshotOptions& options) const {
  auto choice_of = [this](uint64_t seq, uint64_t* id, int* index) {
    auto it = choices_.find(seq);
    if (it == choices_.end()) return false;
    *id = it->second.parent;
    *index = it->second.index;
    return true;
  };
  fill_snapshot(*sched_, *kv_, choice_of, options, out);
  copy_counters(stats(), out);
}

std::vector<int32_t> EngineImpl::cached_block_tokens(int32_t block) const {
  const kv::PrefixCache& c = kv_->cache();
  if (block <= 0 || block >= kv_->pool().num_blocks() || !c.contains(block)) return {};
  std::span<const kv::TokenId> t = c.tokens_of(block);
  return {t.begin(), t.end()};
}

std::string EngineImpl::cached_block_salt(int32_t block) const {
  const kv::PrefixCache& c = kv_->cache();
  if (block <= 0 || block >= kv_->pool().num_blocks() || !c.contains(block)) return "";
  return std::string(c.salt_of(block));
}

std::vector<KvBlockKey> EngineImpl::kv_block_keys(const SnapshotOptions& options) const {
  std::vector<KvBlockKey> out;
  const kv::PrefixCache& c = kv_->cache();
  for (kv::BlockId b = 1; b < kv_->pool().num_blocks(); ++b) {
    if (!c.contains(b) || !salt_visible(options, c.salt_of(b))) continue;
    if (c.group_of(b) == kv_->state_group()) continue;  // a state checkpoint: not announced (kv/prefix_cache.h)
    out.push_back(KvBlockKey{c.group_of(b), "cpu", c.chain_of(b).lo});
  }
  // The disk tier's files do not say their tenant: a tenant's view leaves them out.
  if (tiers_ && !options.only_tenant) {
    for (const auto& [g, h] : tiers_->disk_blocks()) out.push_back(KvBlockKey{g, "disk", h});
    for (const auto& [g, h] : tiers_->redis_blocks()) out.push_back(KvBlockKey{g, "redis", h});
  }
  return out;
}

}  // namespace

Expected<std::unique_ptr<Engine>> Engine::create(const EngineConfig& config) {
  auto e = std::make_unique<EngineImpl>();
  PAGODA_TRY(e->init(config));
  return std::unique_ptr<Engine>(std::move(e));
}

ThreadPoolCounts thread_pool_counts() {
  const kernels::PoolCounts c = kernels::pool_counts();
  return {c.stalls, c.long_waits};
}

}  // namespace pagoda::engine
