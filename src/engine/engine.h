// The engine: the only stateful glue. Owns the scheduler, the KV manager, the
// model runner and per-request samplers; one step() is schedule -> run ->
// postprocess. Single-threaded: call every method from one thread (the server
// wraps it in AsyncEngine, which owns that thread). Outside the tests, step() is
// called only through engine::Driver (engine/driver.h).
//
// A request's state: one record per layer, each field in one of them (issue 34).
//   server::Generation (per HTTP request): what the client is sent: per choice
//     text, tokens and logprobs (non-streamed only), finish; usage counts come
//     from the events' num_output_tokens.
//   server::AsyncEngine::Route (per engine request): routing only (ticket,
//     prompt index).
//   engine::DrivenRequest (engine/driver.h, per request, every choice): the
//     driver's record, what every caller of step() measures: timestamps
//     (submitted, first scheduled, first and last token), choices finished,
//     max_tokens and every choice's output count, kept because the engine's
//     records are gone when the request's histograms are observed; the finish
//     of a request the engine dropped. Tokens and text only for the offline
//     callers (DriverOptions::accumulate, loadgen::Stream).
//   engine Choice (engine.cc, per choice): what sampling adds: the Sampler
//     (RNG, penalty counts), the FinishRule (detokenizer, stop strings, its
//     max_tokens/context limit), forced tokens, grammar matcher, draft throttle.
//     Token counts are the scheduler's (TokenEvent::num_prompt_tokens and
//     num_output_tokens are read from sched::Request).
//   sched::Request (per choice once forked): tokens (prompt + outputs), prompt
//     length, max_tokens, salt, priority, state, prefix hit, the pin request.
//   kv::KvManager::Seq (per admitted sequence): cache state (computed tokens,
//     block keys, entries, reservation) and a pin not yet made.
// Kept twice on purpose: the pin request (sched::Request::pin_tokens holds it
// for readmission after a preemption, which frees the Seq; the Seq holds it
// only until its blocks are committed and pinned); max_tokens (the scheduler
// bounds drafts and checks it, the FinishRule decides the finish on it); the
// Sampler's copy of the prompt, only with a repetition penalty (it seeds the
// per-vocabulary `seen` flags; the Sampler takes any logits size and is used
// without a scheduler) and its list of generated tokens (generated(), read by
// its tests; a rebuild for another vocabulary size needs it).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/generation.h"
#include "base/kv_dtype.h"
#include "base/status.h"
#include "engine/snapshot.h"
#include "engine/speculative.h"
#include "sample/params.h"
#include "sample/request_params.h"
#include "tier/tier_stats.h"

namespace pagoda::tok { class Tokenizer; }
namespace pagoda::grammar { class CompiledGrammar; }

namespace pagoda::engine {

using RequestId = uint64_t;

// The vocabulary shared with sched/, sample/ and server/ (base/generation.h).
using pagoda::FinishReason;
using pagoda::finish_reason_name;
using pagoda::TokenLogprob;
using pagoda::KvDtype;
using pagoda::KvTypes;

struct EngineConfig {
  std::string model_path;
  int threads = 2;
  int context_length = 0;            // 0: the model's own (capped by the pool)
  KvTypes kv_dtype = KvDtype::F16;   // K and V types (one KvDtype sets both)
  int block_size = 16;
  int64_t kv_cache_memory = 0;       // bytes for the KV pool (0: use num_kv_blocks or a default)
  int num_kv_blocks = 0;             // explicit pool size in blocks (wins over kv_cache_memory)
  // Single-sequence use (run, bench): the pool holds exactly one sequence of the
  // context length (+ the null block); wins over num_kv_blocks and kv_cache_memory.
  bool kv_pool_one_context = false;
  bool enable_prefix_caching = true;
  // Hybrid models (a recurrent state group): keep a copy of a sequence's state
  // every this many blocks (kv/state_checkpoint.cc), so prefix hits restore
  // it; 0 = no checkpoints, and prefix caching is off for such a model. No
  // effect on other models. --state-checkpoint-interval.
  int state_checkpoint_interval = 4;
  bool ref_kernels = false;          // scalar reference kernels instead of the SIMD ones (debugging)
  // No KV cache (the KV-cache-vs-recompute baseline): every step computes each
  // scheduled sequence again from position 0 into its own blocks, so a decode
  // step costs a prefill of the whole sequence. Greedy output is the cached
  // path's. Turns prefix caching off; requests must have n == 1.
  bool recompute = false;
  int max_num_seqs = 64;
  int max_num_batched_tokens = 2048; // the hard cap of tokens per step
  // --max-num-batched-tokens auto (the CLI's default; off here so engine tests
  // never depend on step timing): prefill gets what keeps a step within
  // auto_step_factor x a pure decode step's measured time, at least
  // auto_min_prefill_tokens (sched/step_cost.h). Outputs do not change.
  bool auto_batched_tokens = false;
  double auto_step_factor = 2.0;
  int auto_min_prefill_tokens = 64;
  double watermark = 0.01;           // admission keeps this fraction of blocks free
  bool schedule_lpm = false;         // admit longest cached prefix first (else arrival order)
  // vLLM's --scheduling-policy: "fcfs" (arrival order; schedule_lpm may make it
  // lpm) or "priority" (RequestParams::priority, lower first; preempts worse).
  std::string scheduling_policy = "fcfs";
  // Pinned prefixes (RequestParams::pin_tokens) hold at most this fraction of
  // the pool's blocks; past it the least recently touched pin is demoted.
  double kv_pinned_fraction = 0.2;
  // Tests: the clock of pin TTLs in seconds (empty: a steady clock).
  std::function<double()> kv_clock_for_testing;
  // vLLM's flag: one KV cache group, every layer keeps a full-context table
  // (sliding windows stay masks). Else layers form groups by attention kind
  // and window layers hold only their window (kv/sizing's kv_group_layout).
  bool disable_hybrid_kv_cache_manager = false;
  // KV tiers below the RAM prefix cache (issue 16, engine/kv_tiers.h). They
  // need prefix caching; one entry per block per KV group. Empty: off.
  std::string kv_disk_dir;           // one file per block, survives restarts
  int64_t kv_disk_size = 0;          // bytes the disk tier may hold (LRU beyond)
  bool kv_disk_fsync = true;         // fsync each entry before its rename, the directory per burst
  int kv_disk_inject_errno = 0;      // tests: every disk write fails with this errno (ENOSPC, EROFS)
  std::string kv_redis;              // redis://HOST:PORT[,HOST:PORT...]: one node or a Redis Cluster
  int kv_redis_ttl = 0;              // seconds; 0: no TTL (Redis's maxmemory policy evicts)
  // The deployment's secret for the tier entries (tier/entry.h: keyed names,
  // encrypted K/V, a MAC); the same on every replica sharing a tier. Empty:
  // entries are integrity-checked only (whoever reads the store is trusted).
  std::string kv_tier_secret;
  // KV events (issue 37, engine/kv_events_link.h): vLLM's --kv-events-config
  // JSON; "" or a config that turns them off: no publisher, no sink, no work.
  std::string kv_events_config;
  // Speculative decoding by prompt lookup (engine/speculative.h); off by
  // default. Greedy outputs stay bitwise those of plain decoding; sampled ones
  // keep their distribution. Choices with a grammar, logprobs, return_logits
  // or forced tokens left do not speculate. Not with recompute.
  SpeculativeConfig speculative;
};

// What one request asks for (sample/request_params.h: below engine/, so the API
// layer in openai/ parses into it without linking the engine).
using sample::RequestParams;

// One event per (request, choice) that made progress in a step.
struct TokenEvent {
  RequestId id = 0;
  int index = 0;                     // choice index (0..n-1)
  std::vector<int32_t> tokens;       // new tokens this step
  std::string text;                  // new text (UTF-8 complete, stop strings cut)
  std::vector<TokenLogprob> logprobs;
  std::vector<float> logits;         // [n_vocab] the row the token came from (return_logits only)
  int32_t argmax = -1;               // a forced token: the greedy pick of that row (else -1)
  int32_t num_kv_blocks = 0;         // KV blocks the sequence held in this step (all groups)
  FinishReason finish = FinishReason::kNone;
  std::string error;                 // set when finish == kError
  int32_t num_prompt_tokens = 0;
  int32_t num_cached_tokens = 0;     // prompt tokens served from the prefix cache
  int32_t num_output_tokens = 0;     // total so far for this choice
  // Why the prefix-cache hit ended where it did (kv/prefix_miss.h), on the
  // first event of a choice only (empty on the others): "none", "never_seen",
  // "evicted", "salt", "tier_miss", "diverged".
  std::string prefix_miss;
  int32_t prefix_miss_position = -1;  // diverged: first prompt token differing from the cache
  double prefix_evicted_ago_s = -1;   // evicted / tier_miss: seconds since the eviction
};

// One KV tier below RAM, cumulative: the tiers' own counters (tier/tier_stats.h,
// declared once), re-exported so server/ reads them through engine/.
using KvTierStats = tier::TierStats;
// Bounds of KvTierStats::load_latency_buckets in seconds (the last bucket is +Inf).
inline constexpr const auto& kKvTierLoadLatencyBounds = tier::kLoadLatencyBounds;

struct EngineStats {
  int num_running = 0;
  int num_waiting = 0;
  int64_t blocks_total = 0;          // usable blocks (excluding the null block)
  int64_t blocks_free = 0;           // free and never-cached or evictable
  int64_t blocks_used = 0;           // referenced by a running request
  int64_t blocks_cached = 0;         // free but holding a reusable prefix
  double kv_usage = 0;               // blocks_used / blocks_total
  int64_t prefix_queries_tokens = 0;
  int64_t prefix_hits_tokens = 0;
  int64_t num_preemptions = 0;
  int64_t prompt_tokens_total = 0;
  int64_t generation_tokens_total = 0;
  int64_t computed_tokens_total = 0;   // tokens through the forward pass (recompute: again every step)
  std::vector<int64_t> group_blocks_used;  // [kv groups] blocks held by each KV cache group
  int64_t grammar_tokens_total = 0;    // tokens sampled under a grammar
  int64_t grammar_mask_ns_total = 0;   // wall time filling their masks (the per-step parallel pass)
  int num_waiting_for_kv_load = 0;     // of num_waiting: held for tier loads
  std::vector<KvTierStats> kv_tiers;   // [tiers] disk, then Redis (empty: none)
  // KV events (issue 37): messages and events published, batches and events
  // dropped by the publisher's full queue (all 0 when events are off).
  int64_t kv_events_batches = 0, kv_events_events = 0;
  int64_t kv_events_dropped_batches = 0, kv_events_dropped_events = 0;
  // Speculative decoding (vLLM's spec_decode_* counters): drafts verified,
  // their tokens, the accepted ones, and accepted ones by draft position
  // ([num_speculative_tokens]). Acceptance rate = accepted / draft tokens.
  int64_t spec_num_drafts = 0;
  int64_t spec_num_draft_tokens = 0;
  int64_t spec_num_accepted_tokens = 0;
  std::vector<int64_t> spec_accepted_per_pos;
  // Pins (issue 36): live pins, the distinct blocks they hold (part of
  // blocks_used), the cap, and pins created / expired by their TTL / demoted
  // by the cap or by admission / cleared by reset_prefix_cache.
  int64_t pins = 0;
  int64_t blocks_pinned = 0;
  int64_t blocks_pinned_cap = 0;
  int64_t pins_created = 0, pins_renewed = 0, pins_expired = 0, pins_demoted = 0, pins_cleared = 0;
  // Hybrid models: recurrent-state checkpoints made or imported inside a live pin
  // and pinned with it, and those left unpinned because the cap had no room.
  int64_t pins_checkpoints_added = 0, pins_checkpoints_over_cap = 0;
  int64_t prefix_cache_resets = 0;
  // Recurrent-state checkpoints (kv/state_checkpoint.cc): live in the cache,
  // and made / restored by a prefix hit / evicted since start.
  int64_t checkpoints = 0;
  int64_t checkpoints_stored = 0, checkpoints_hit = 0, checkpoints_evicted = 0;
  // Requests by priority value, ascending ((priority, count); every request
  // is priority 0 unless scheduling_policy is "priority").
  std::vector<std::pair<int32_t, int32_t>> waiting_by_priority, running_by_priority;
};

struct ModelInfo {
  std::string name;                  // file stem
  std::string architecture;
  int context_length = 0;            // what the engine accepts: prompt + max_tokens <= this
  int vocab_size = 0;
  int n_ctx_train = 0;               // the model's own context length
  int n_layers = 0;
  int n_embd = 0;
  uint64_t weight_bytes_per_token = 0;  // weight bytes read per decoded token
  const char* isa = "";              // the CPU kernels' instruction set
  KvTypes kv_dtype = KvDtype::F16;   // K and V types
  int64_t kv_bytes_per_token = 0;
  int64_t kv_bytes_per_block = 0;
  int64_t kv_cache_tokens = 0;       // pool capacity in tokens
  int64_t kv_cache_bytes = 0;
  int num_kv_blocks = 0;
  int block_size = 0;
  // KV cache groups: layer slots per block and each group's window (0 = full).
  int kv_group_size = 0;
  std::vector<int> kv_group_windows;
  // Blocks (all groups) one sequence of context_length tokens holds while it
  // decodes (kv/sizing's kv_blocks_for_sequence); concurrency = blocks / this.
  int64_t kv_blocks_per_context = 0;
};

// The CPU thread pool's co-tenancy counters so far, process-wide
// (kernels::pool_counts): stalls and long waits. `pagoda bench` reports them
// per multi-thread tg test.
struct ThreadPoolCounts {
  int64_t stalls = 0, long_waits = 0;
};
ThreadPoolCounts thread_pool_counts();

class Engine {
 public:
  static Expected<std::unique_ptr<Engine>> create(const EngineConfig& config);
  virtual ~Engine() = default;

  // Validates and queues a request; an error leaves the engine unchanged.
  virtual Expected<RequestId> add_request(const RequestParams& params) = 0;
  // Aborts a request in any state; its blocks are freed at once. Unknown ids are ignored.
  virtual void abort(RequestId id) = 0;
  // One engine step. Returns the events of this step (finished requests included).
  virtual std::vector<TokenEvent> step() = 0;
  virtual bool has_unfinished() const = 0;
  // The requests the last step() scheduled for the first time: where a request's
  // queue time ends (vLLM's "first scheduled"), however long it waited behind
  // admission. Valid until the next step().
  virtual const std::vector<RequestId>& newly_scheduled() const = 0;
  virtual EngineStats stats() const = 0;
  virtual const ModelInfo& model_info() const = 0;
  virtual const tok::Tokenizer& tokenizer() const = 0;
  // The dashboard's picture of the cache and queues (engine/snapshot.h), taken
  // between steps; overwrites *out (its vectors are reused). O(blocks + table entries).
  virtual void snapshot(DashboardSnapshot* out, const SnapshotOptions& options) const = 0;
  // The token ids of cached block `block` (its prefix-cache record); empty when
  // the block holds no prefix key or is out of range.
  virtual std::vector<int32_t> cached_block_tokens(int32_t block) const = 0;
  // The cache salt a cached block was committed under ("" when none or not cached):
  // the dashboard shows a tenant only its own blocks' text.
  virtual std::string cached_block_salt(int32_t block) const = 0;
  // Every block the engine holds, per KV group and medium ("cpu": the RAM
  // prefix cache), with the low 64 bits of its chain key: what a subscriber
  // replaying the KV events should hold (issue 37). Only the tenant's own
  // blocks when `options` filters. Between steps; O(blocks).
  virtual std::vector<KvBlockKey> kv_block_keys(const SnapshotOptions& options) const {
    (void)options;
    return {};
  }
  // Empties the prefix cache (vLLM's reset_prefix_cache): every pin and every
  // cached block goes. Refused while requests run unless force, which preempts
  // them first (they recompute and complete with their full output). With
  // `tiers`, the disk and Redis tiers lose this engine's entries too (its
  // namespace: model, KV types, block size; never another engine's), and
  // *cleared (when given) gets (tier kind, entries removed) per tier.
  virtual Status reset_prefix_cache(bool force, bool tiers,
                                    std::vector<std::pair<std::string, int64_t>>* cleared) = 0;
  Status reset_prefix_cache(bool force) { return reset_prefix_cache(force, false, nullptr); }
  // Seconds left of the pin holding block b longest (0: not pinned).
  virtual double pin_ttl_left(int32_t block) const = 0;
  // Tests: the scheduler's and the KvManager's invariants between steps
  // ("" when all hold, else the first violation). O(blocks + table entries).
  virtual std::string check_invariants() const { return ""; }
};

}  // namespace pagoda::engine
