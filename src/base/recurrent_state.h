// The fixed-size recurrent state of a hybrid model's layers (issue 38): how
// many f32 rows, of how many floats, one sequence keeps. One formula for the
// engine (model/lfm2.cc and model/qwen35.cc fill ModelConfig::n_state_rows
// with it) and for sizing (sim/ reads the same shape from a preset, a Hugging
// Face config.json or a GGUF file), so the two cannot drift. In base/ because
// it is the lowest layer both model/ and sim/ may include.
//
// A state is n_layers x rows_per_layer rows of row_floats f32 each (the
// layout kv/recurrent_state_group.cc keeps in the KV pool's blocks):
//   short convolution (lfm2): a causal depthwise convolution of conv_kernel
//     taps (shortconv.l_cache) over `channels` (n_embd) channels keeps its
//     previous conv_kernel - 1 inputs: conv_kernel - 1 rows of `channels`.
//   Gated DeltaNet (qwen35): a causal convolution of conv_kernel taps over
//     q | k | v (2 k_heads + v_heads heads of head_dim S) keeps conv_kernel - 1
//     inputs, each 2 k_heads + v_heads rows of S; then each v head's S x S state
//     matrix, S rows of S: (conv_kernel - 1) x (2 k_heads + v_heads) + v_heads x S
//     rows of S floats.
//   Mamba-2 (mamba2): a causal convolution of conv_kernel taps over x | B | C
//     (d_inner + 2 n_group N channels, N = ssm.state_size) keeps conv_kernel - 1
//     inputs, flat in rows of N (d_inner % N == 0: whole rows); then each of the
//     d_inner = heads x head_dim scan rows of N: (conv_kernel - 1) x
//     (d_inner + 2 n_group N) / N + d_inner rows of N floats.
// A new family is a RecurrentKind, a function below and a case in
// recurrent_state_rows.
//
// Tensor parallelism, as vLLM shards these states (MambaStateShapeCalculator
// in vllm/model_executor/layers/mamba/mamba_utils.py): the channels / heads
// are split across the tp ranks and each rank keeps the state of its share;
// vLLM's divide() asserts they divide, and so the split is refused here when
// they do not:
//   short_conv_state_shape: (conv_kernel - 1) x divide(channels, tp)
//     -> the same rows of channels / tp floats;
//   gated_delta_net_state_shape: conv (conv_kernel - 1) x divide(conv_dim, tp)
//     and divide(v_heads, tp) x S x S, with the k heads split as
//     num_k_heads / tp by its GDN layer -> k_heads / tp and v_heads / tp in the
//     formula above, rows of S;
//   mamba2_state_shape: conv (conv_kernel - 1) x divide(d_inner + 2 n_group N, tp)
//     and divide(heads, tp) x head_dim x N -> d_inner / tp and n_group / tp in the
//     formula above (vLLM replicates groups that do not split; refused here).
#pragma once
#include <cstdint>

#include "base/status.h"

namespace pagoda {

enum class RecurrentKind : uint8_t {
  kNone,
  kShortConv,      // lfm2
  kGatedDeltaNet,  // qwen35
  kMamba2,         // mamba2
};

// The shape a recurrent layer's state follows (every recurrent layer of a model has the same).
struct RecurrentShape {
  RecurrentKind kind = RecurrentKind::kNone;
  int32_t conv_kernel = 0;  // taps of the causal convolution (lfm2 l_cache, qwen35 ssm.conv_kernel)
  int32_t channels = 0;     // short conv: the convolved channels (n_embd); Mamba-2: d_inner (ssm.inner_size)
  int32_t k_heads = 0;      // Gated DeltaNet: q / k heads (ssm.group_count); Mamba-2: B/C groups (ssm.group_count)
  int32_t v_heads = 0;      // Gated DeltaNet: v heads (ssm.time_step_rank); Mamba-2: heads (ssm.time_step_rank)
  int32_t head_dim = 0;     // Gated DeltaNet: S, the head dim of q, k and v; Mamba-2: N (both ssm.state_size)
  bool operator==(const RecurrentShape&) const = default;
};

// One sequence's state: rows x row_floats f32 (both 0: no state).
struct StateRows {
  int64_t rows = 0;
  int32_t row_floats = 0;
  uint64_t bytes() const { return static_cast<uint64_t>(rows) * static_cast<uint64_t>(row_floats) * sizeof(float); }
  bool operator==(const StateRows&) const = default;
};

// lfm2: n_layers x (l_cache - 1) rows of `channels` floats.
inline StateRows short_conv_state(int32_t n_layers, int32_t l_cache, int32_t channels) {
  if (n_layers <= 0) return {};
  return {int64_t{n_layers} * (l_cache - 1), channels};
}

// qwen35: n_layers x ((conv_kernel - 1) x (2 k_heads + v_heads) + v_heads x S) rows of S floats.
inline StateRows gated_delta_net_state(int32_t n_layers, int32_t conv_kernel, int32_t k_heads, int32_t v_heads,
                                       int32_t head_dim) {
  if (n_layers <= 0) return {};
  const int64_t per_layer = int64_t{conv_kernel - 1} * (2 * int64_t{k_heads} + v_heads) + int64_t{v_heads} * head_dim;
  return {int64_t{n_layers} * per_layer, head_dim};
}

// mamba2: n_layers x ((conv_kernel - 1) x (d_inner + 2 n_group N) / N + d_inner) rows of N floats.
// Precondition: d_inner % N == 0 (model/mamba2.cc refuses other shapes).
inline StateRows mamba2_state(int32_t n_layers, int32_t conv_kernel, int32_t d_inner, int32_t n_group, int32_t state_size) {
  if (n_layers <= 0 || state_size <= 0) return {};
  const int64_t conv_dim = int64_t{d_inner} + 2 * int64_t{n_group} * state_size;
  return {int64_t{n_layers} * (int64_t{conv_kernel - 1} * conv_dim / state_size + d_inner), state_size};
}

// The state of n_layers recurrent layers of shape s on one of tp ranks (tp = 1: the whole state).
// An error when the channels / heads do not split evenly across tp ranks (vLLM refuses those too).
inline Expected<StateRows> recurrent_state_rows(const RecurrentShape& s, int32_t n_layers, int32_t tp = 1) {
  if (tp < 1) return errorf("recurrent state: tp must be >= 1 (got %d)", tp);
  switch (s.kind) {
    case RecurrentKind::kNone:
      return StateRows{};
    case RecurrentKind::kShortConv:
      if (s.channels % tp != 0)
        return errorf("recurrent state: the short convolution's %d channels do not split across tp %d ranks",
                      s.channels, tp);
      return short_conv_state(n_layers, s.conv_kernel, s.channels / tp);
    case RecurrentKind::kGatedDeltaNet:
      if (s.k_heads % tp != 0 || s.v_heads % tp != 0)
        return errorf("recurrent state: the Gated DeltaNet's %d k heads and %d v heads do not split across tp %d ranks",
                      s.k_heads, s.v_heads, tp);
      return gated_delta_net_state(n_layers, s.conv_kernel, s.k_heads / tp, s.v_heads / tp, s.head_dim);
    case RecurrentKind::kMamba2:
      if (s.k_heads % tp != 0 || s.v_heads % tp != 0 || s.head_dim <= 0 || (s.channels / tp) % s.head_dim != 0)
        return errorf("recurrent state: the Mamba-2 state's %d groups, %d heads and %d inner channels (rows of %d) do "
                      "not split across tp %d ranks", s.k_heads, s.v_heads, s.channels, s.head_dim, tp);
      return mamba2_state(n_layers, s.conv_kernel, s.channels / tp, s.k_heads / tp, s.head_dim);
  }
  return StateRows{};
}

}  // namespace pagoda
