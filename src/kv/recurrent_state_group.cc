// Recurrent state (KvGroupSpec::state_blocks = S > 0): the fixed-size state of
// a hybrid model's recurrent layers (LFM2's short convolutions; the design
// leaves room for bigger states such as Gated DeltaNet's) as one slot of S
// blocks per sequence, taken from the ONE pool like any KV block, so
// admission, preemption and the capacity line count it. S = ceil(state rows /
// state rows per block) (kv/sizing's kv_state_blocks): the runner packs the
// state's rows into the S blocks' K/V chunks (runtime/kv_storage.h). The
// table has S entries from the first token on, whatever the sequence's length:
//   - every step rewrites the whole state: copy-on-write covers all S entries,
//     so a fork (n > 1) shares the slot until a child's first step copies it;
//   - nothing is ever released early, and nothing enters the prefix cache (a
//     state is only valid at its own length: a model with this group runs
//     with prefix caching off until state checkpoints exist);
//   - a sequence cannot be truncated below its computed tokens (the state
//     cannot roll back), so speculative decoding is refused for such models;
//   - preemption frees the slot; recomputation starts from the zero state
//     (the forward zeroes it when a sequence's first token is at position 0).
#include "kv/group_manager.h"

namespace pagoda::kv {
namespace {

class RecurrentStateGroup final : public GroupManager {
 public:
  using GroupManager::GroupManager;
  const char* kind() const override { return "recurrent_state"; }
  int32_t first_needed_block(int64_t /*start*/) const override { return 0; }
  int64_t peak_blocks(int64_t num_tokens, int32_t /*max_chunk*/) const override {
    return num_tokens > 0 ? spec_.state_blocks : 0;
  }
  int64_t held_blocks(SeqId seq) const override { return num_entries(seq); }
  int64_t held_after_allocate(std::span<const BlockId> /*hit*/, int32_t /*first_live*/,
                              int32_t total_blocks) const override {
    return table_entries(total_blocks);
  }
  int32_t releasable_blocks(SeqId /*seq*/, int64_t /*start*/) const override { return 0; }
  void release_before(SeqId /*seq*/, int64_t /*start*/) override {}
  int32_t table_entries(int32_t logical) const override { return logical > 0 ? spec_.state_blocks : 0; }
  int32_t first_written_entry(int32_t /*num_computed*/) const override { return 0; }
  bool entry_computed(int32_t /*j*/, int32_t num_computed) const override { return num_computed > 0; }
  bool can_roll_back() const override { return false; }
};

}  // namespace

extern const GroupKind kRecurrentStateKind;
const GroupKind kRecurrentStateKind{
    "recurrent_state", [](const KvGroupSpec& s) { return s.state_blocks > 0; },
    [](const KvGroupSpec& s, int32_t bs, SharedBlocks* b) -> std::unique_ptr<GroupManager> {
      return std::make_unique<RecurrentStateGroup>(s, bs, b);
    }};

}  // namespace pagoda::kv
