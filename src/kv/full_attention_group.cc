// Full-context attention (KvGroupSpec::sliding_window == 0): every token sees
// every earlier key, so a sequence reads all its entries and gives none back
// before it ends.
#include "kv/group_manager.h"
#include "kv/sizing.h"

namespace pagoda::kv {
namespace {

class FullAttentionGroup final : public GroupManager {
 public:
  using GroupManager::GroupManager;
  const char* kind() const override { return "full"; }
  int32_t first_needed_block(int64_t /*start*/) const override { return 0; }
  int64_t peak_blocks(int64_t num_tokens, int32_t max_chunk) const override {
    return kv_group_blocks_for_sequence(num_tokens, block_size_, 0, max_chunk);
  }
  // Never releases: its table length is what it took, shared or not.
  int64_t held_blocks(SeqId seq) const override { return num_entries(seq); }
  int64_t held_after_allocate(std::span<const BlockId> /*hit*/, int32_t /*first_live*/,
                              int32_t total_blocks) const override {
    return total_blocks;
  }
  int32_t releasable_blocks(SeqId /*seq*/, int64_t /*start*/) const override { return 0; }
  void release_before(SeqId /*seq*/, int64_t /*start*/) override {}
};

}  // namespace

extern const GroupKind kFullAttentionKind;
const GroupKind kFullAttentionKind{
    "full", [](const KvGroupSpec& s) { return s.sliding_window == 0 && s.state_blocks == 0; },
    [](const KvGroupSpec& s, int32_t bs, SharedBlocks* b) -> std::unique_ptr<GroupManager> {
      return std::make_unique<FullAttentionGroup>(s, bs, b);
    }};

}  // namespace pagoda::kv
