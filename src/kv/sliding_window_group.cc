// Sliding-window attention (KvGroupSpec::sliding_window = W > 0): a token at p
// sees keys p - W < j <= p. Before a step from `start`, every block wholly
// before key start - W + 1 goes back to the pool (cached-evictable when
// committed) and its entry becomes the null block.
#include <algorithm>

#include "kv/group_manager.h"
#include "kv/sizing.h"

namespace pagoda::kv {
namespace {

class SlidingWindowGroup final : public GroupManager {
 public:
  using GroupManager::GroupManager;
  const char* kind() const override { return "sliding_window"; }
  int32_t first_needed_block(int64_t start) const override {
    return static_cast<int32_t>(std::max<int64_t>(0, start - spec_.sliding_window + 1) / block_size_);
  }
  int64_t peak_blocks(int64_t num_tokens, int32_t max_chunk) const override {
    return kv_group_blocks_for_sequence(num_tokens, block_size_, spec_.sliding_window, max_chunk);
  }
  // Counts the blocks it holds alone: releasing a shared one frees nothing.
  int64_t held_blocks(SeqId seq) const override {
    const Table& t = ref(seq);
    return held_alone(t, t.first_live, static_cast<int32_t>(t.blocks.size()));
  }
  // All but the null entries before first_live and the hits another sequence still holds.
  int64_t held_after_allocate(std::span<const BlockId> hit, int32_t first_live, int32_t total_blocks) const override {
    int64_t held = total_blocks - first_live;
    for (BlockId b : hit) held -= b != kNullBlock && pool().ref_count(b) > 0 ? 1 : 0;
    return held;
  }
  int32_t releasable_blocks(SeqId seq, int64_t start) const override {
    const Table& t = ref(seq);
    return held_alone(t, t.first_live, release_end(t, start));  // shared ones stay with the other holder
  }
  void release_before(SeqId seq, int64_t start) override {
    Table& t = mut(seq);
    const int32_t lo = release_end(t, start);
    for (int32_t i = t.first_live; i < lo; ++i) {
      BlockId& b = t.blocks[static_cast<size_t>(i)];
      if (b == kNullBlock) continue;
      pool().decref(b);  // committed: cached-evictable, a prefix hit may revive it; else free
      b = kNullBlock;
    }
    t.first_live = std::max(t.first_live, lo);
  }

 private:
  int32_t release_end(const Table& t, int64_t start) const {
    return std::min(static_cast<int32_t>(t.blocks.size()), first_needed_block(start));
  }
};

}  // namespace

extern const GroupKind kSlidingWindowKind;
const GroupKind kSlidingWindowKind{
    "sliding_window", [](const KvGroupSpec& s) { return s.sliding_window > 0 && s.state_blocks == 0; },
    [](const KvGroupSpec& s, int32_t bs, SharedBlocks* b) -> std::unique_ptr<GroupManager> {
      return std::make_unique<SlidingWindowGroup>(s, bs, b);
    }};

}  // namespace pagoda::kv
