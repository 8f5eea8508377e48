// KV cache sizing: how many bytes one token, one sequence and one block of the
// cache take, and how many blocks / requests a byte budget holds. Pure
// arithmetic on a plain description of the attention (no GGUF, no tensors, no
// model config), so the engine (its pool: kv_bytes_per_block and
// num_blocks_for_budget), `pagoda size` and sim/ all size the cache with the
// same functions.
//
// Layout assumed per layer and per token:
//   MHA / GQA / MQA: a K row and a V row per KV head -> 2 x kv_heads x row(head_dim)
//   MLA (DeepSeek-V2/V3): one latent row shared by K and V, no factor 2 ->
//                         row(kv_lora_rank + qk_rope_head_dim)
// where row(n) is the bytes of n elements in the cache dtype; block-quantized
// dtypes (q8_0: 34 bytes per 32, q4: 18 bytes per 32) round a row up to whole
// blocks, as a quantized row cannot share a block with the next head.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/kv_dtype.h"
#include "base/status.h"
#include "kv/types.h"

namespace pagoda::kv {

enum class AttentionKind : uint8_t {
  kMHA,  // kv_heads == heads
  kGQA,  // 1 < kv_heads < heads
  kMQA,  // kv_heads == 1
  kMLA,  // compressed latent (kv_lora_rank + qk_rope_head_dim), shared by all heads
};
const char* attention_kind_name(AttentionKind k);
// "mha", "gqa", "mqa", "mla" (case-insensitive).
Expected<AttentionKind> parse_attention_kind(const std::string& s);

// The attention of a model as the KV cache sees it.
struct KvShape {
  AttentionKind kind = AttentionKind::kGQA;
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;       // MLA: ignored (one latent per token per layer)
  int32_t head_dim = 0;           // K head dim
  int32_t v_head_dim = 0;         // V head dim; 0 = head_dim. MLA: ignored
  int32_t kv_lora_rank = 0;       // MLA only
  int32_t qk_rope_head_dim = 0;   // MLA only (the decoupled RoPE key, cached beside the latent)
  // Sliding window: 0 = none. With a window, `swa_period` says which layers are
  // local: in each group of swa_period layers the first swa_period - 1 are local
  // (sliding window) and the last is global (Gemma 2: 2, Gemma 3: 6 -> 5 local per
  // global). swa_period == 0 means every layer is local (Mistral-7B v0.1).
  int32_t sliding_window = 0;
  int32_t swa_period = 0;

  bool is_local_layer(int32_t layer) const;  // precondition: 0 <= layer < num_layers
  int32_t num_local_layers() const;
  int32_t num_global_layers() const { return num_layers - num_local_layers(); }
};

// Checks the fields needed by `kind` are positive and consistent.
Status validate_kv_shape(const KvShape& shape);

// Storage dtype of the cache: `block_bytes` bytes per `block_elems` elements.
// A planning descriptor: it also names dtypes pagoda does not store (fp8, int8);
// the engine's cache dtypes are the one enum pagoda::KvDtype (base/kv_dtype.h),
// turned into a descriptor by kv_dtype_of. V may have a type of its own
// (llama.cpp's -ctk / -ctv): v_block_bytes > 0 gives it; 0 means V is K's type.
struct KvDtype {
  const char* name = "f16";
  int32_t block_elems = 1;
  int32_t block_bytes = 2;
  const char* v_name = nullptr;  // V's type when v_block_bytes > 0
  int32_t v_block_elems = 0;
  int32_t v_block_bytes = 0;
};
// The descriptor of K's type alone and of V's type alone (V: K's when it has none).
KvDtype kv_k_dtype(const KvDtype& d);
KvDtype kv_v_dtype(const KvDtype& d);
// "q8_0", or "q8_0/q4_0" (K/V) when V has a type of its own.
std::string kv_dtype_label(const KvDtype& d);
// K's descriptor `k` with V's type `v` (the pair kv_dtype_of(KvTypes) builds).
KvDtype kv_dtype_pair(const KvDtype& k, const KvDtype& v);
KvDtype kv_dtype_f32();
KvDtype kv_dtype_f16();
KvDtype kv_dtype_bf16();
KvDtype kv_dtype_fp8();   // e4m3 / e5m2, 1 byte
KvDtype kv_dtype_int8();  // 1 byte (per-tensor or per-head scale kept outside the cache)
KvDtype kv_dtype_q8_0();  // 34 bytes per 32 (fp16 scale + 32 x int8)
KvDtype kv_dtype_q4();    // 18 bytes per 32 (q4_0: fp16 scale + 32 x 4 bit)
// The descriptor of one of the engine's cache dtypes (same name, same row bytes),
// or of a K/V pair (V's fields set when the types differ).
KvDtype kv_dtype_of(pagoda::KvDtype d);
KvDtype kv_dtype_of(pagoda::KvTypes t);
// "f32|fp32", "f16|fp16", "bf16", "fp8", "int8", "q8_0", "q4|q4_0", "q4_1",
// "iq4_nl", "q5_0", "q5_1" (case-insensitive); "K/V" (e.g. "q8_0/q4_0") for a pair.
Expected<KvDtype> parse_kv_dtype(const std::string& s);

// Bytes of one cached row of n elements: ceil(n / block_elems) x block_bytes.
uint64_t kv_row_bytes(const KvDtype& dtype, int64_t n);

// Bytes one token occupies in ONE layer (K + V rows of every KV head, each in
// its own type, or the MLA latent in K's type).
uint64_t kv_bytes_per_token_per_layer(const KvShape& shape, const KvDtype& dtype);

// Full-context worst case: every layer stores every token (layers x per-layer bytes).
// This is what a block of the paged pool costs per token, since one block id covers all layers.
uint64_t kv_bytes_per_token(const KvShape& shape, const KvDtype& dtype);

// Bytes a sequence of `num_tokens` tokens needs when sliding-window layers keep
// at most `sliding_window` tokens: global layers x L + local layers x min(L, window).
// Equals num_tokens x kv_bytes_per_token when there is no window.
uint64_t kv_bytes_for_sequence(const KvShape& shape, const KvDtype& dtype, int64_t num_tokens);

// One block of `block_size` tokens across all layers: block_size x kv_bytes_per_token.
uint64_t kv_bytes_per_block(const KvShape& shape, const KvDtype& dtype, int32_t block_size);

// The shape one tensor-parallel rank stores: KV heads are split across `tp`
// ranks, at least one head per rank (heads are replicated when kv_heads < tp),
// i.e. ceil(kv_heads / tp). MLA's latent is not split by head: every rank keeps
// the whole latent. Precondition: tp >= 1.
KvShape shard_for_tp(const KvShape& shape, int32_t tp);

// ---- KV cache groups (the hybrid manager; kv::KvManager allocates this way) --
// Layers of one attention kind (full context; sliding window W) form groups of
// G layers each, G = the smallest kind's layer count (vLLM's choice); a kind's
// last group is padded with unused layer slots. Every block of the one pool
// holds G layer slots x block_size tokens x K,V, so a block costs the same in
// every group. Gemma 3 270M (3 global + 15 window-512 layers): G = 3, one full
// group then 5 window groups.
//
// Hybrid models: a layer of window kStateWindow (-1) is recurrent (no K/V):
// it joins no attention group; the layout ends with ONE recurrent state group
// (windows entry kStateWindow, layer_group of every recurrent layer, layer_slot
// -1) holding each sequence's whole fixed-size state in state_blocks blocks of
// the same pool (kv/recurrent_state_group.cc; kv::plan_pool sets state_blocks).
inline constexpr int32_t kStateWindow = -1;
struct KvGroupLayout {
  int32_t group_size = 0;            // G: layer slots per block (attention layers only)
  std::vector<int32_t> windows;      // [n_groups] 0 = full context; full groups first; kStateWindow last
  int32_t state_blocks = 0;          // blocks of the state group per sequence (0: none)
  std::vector<int32_t> layer_group;  // [n_layers] the group of each layer
  std::vector<int32_t> layer_slot;   // [n_layers] its slot in the group, 0..G-1
  int32_t num_groups() const { return static_cast<int32_t>(windows.size()); }
  int32_t num_layers() const { return static_cast<int32_t>(layer_group.size()); }
};
// layer_windows[l]: 0 (full), the window of layer l, or kStateWindow (recurrent).
// hybrid = false (or a single kind): one group of every attention layer, G =
// their count (the window, if all share one, is kept only when hybrid); the
// state group, if any, after it. state_blocks is left 0 (plan_pool's).
// Every layer recurrent (an attention-free model, mamba2): one full group of
// G = 1 slot that no layer uses, then the state group; the slot's K/V chunks
// hold the state's rows (kv_state_rows_per_block), the full group's blocks
// only carry the prefix chain. Precondition: windows >= kStateWindow.
KvGroupLayout kv_group_layout(std::span<const int32_t> layer_windows, bool hybrid);
// The windows of a KvShape's layers (is_local_layer -> sliding_window, else 0).
std::vector<int32_t> kv_layer_windows(const KvShape& shape);

// Blocks ONE group holds for a sequence of num_tokens tokens computed in steps
// of at most max_chunk tokens: full: ceil(N/bs); window W: the keys of the last
// step's tokens, L = W + chunk - 1 consecutive tokens on at most
// ceil((L - 1)/bs) + 1 blocks:
//   min(ceil(N/bs), ceil((W + max_chunk - 2)/bs) + 1)
// (decode: ceil((W - 1)/bs) + 1, i.e. W/bs + 1 when bs divides W: Gemma 3's 512 + one block).
int64_t kv_group_blocks_for_sequence(int64_t num_tokens, int32_t block_size, int32_t window, int32_t max_chunk = 1);
// The same summed over a layout's groups (the state group: state_blocks): the blocks a sequence holds.
int64_t kv_blocks_for_sequence(const KvGroupLayout& layout, int64_t num_tokens, int32_t block_size,
                               int32_t max_chunk = 1);
// Bytes of one pool block of a layout: G x block_size x kv_bytes_per_token_per_layer.
uint64_t kv_group_bytes_per_block(const KvShape& shape, const KvDtype& dtype, int32_t block_size,
                                  const KvGroupLayout& layout);

// The recurrent state's packing (hybrid models): a block of the pool is, for
// each of its G layer slots, a K chunk (block_size K rows) and a V chunk
// (block_size V rows); the state's rows of row_bytes each are laid chunk by
// chunk, floor(chunk / row_bytes) rows per chunk, never across a chunk. The
// runner's storage addresses them the same way (runtime/kv_storage.h).
// Rows one block holds (0: a state row is larger than a chunk).
int64_t kv_state_rows_per_block(const KvShape& shape, const KvDtype& dtype, int32_t block_size, int32_t group_size,
                                uint64_t row_bytes);
// Blocks of one sequence's state of n_rows rows: ceil(n_rows / rows_per_block). Precondition: rows_per_block > 0.
int32_t kv_state_blocks(int64_t n_rows, int64_t rows_per_block);

// ---- Paged pool arithmetic (engine/ sizes its pool with these) -------------

// Blocks a byte budget holds: floor(budget_bytes / bytes_per_block).
// Precondition: bytes_per_block > 0.
int64_t num_blocks_for_budget(uint64_t budget_bytes, uint64_t bytes_per_block);

// Blocks a sequence of num_tokens tokens occupies: kv::blocks_for_tokens (kv/types.h).

// Blocks admission keeps free, as kv::KvManager computes it:
//   floor(watermark_frac x (num_blocks - 1) + 1e-9)   (num_blocks includes the null block)
// A request is admitted only if free - needed >= watermark blocks.
int64_t watermark_blocks(int64_t num_blocks, double watermark_frac);

// Blocks available to requests:
//   usable = num_blocks - 1 (block 0 = kNullBlock is never handed out) - watermark_blocks(num_blocks, frac)
// (never negative).
int64_t usable_blocks(int64_t num_blocks, double watermark_frac);

// Requests of `blocks_per_request` blocks each that can be resident at once:
//   floor(usable_blocks(num_blocks, watermark_frac) / blocks_per_request).
// Precondition: blocks_per_request > 0.
int64_t max_concurrency(int64_t num_blocks, int64_t blocks_per_request, double watermark_frac);

}  // namespace pagoda::kv
