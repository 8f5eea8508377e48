// The registered KV group kinds, one file each. A new kind (a chunked-local
// window, a recurrent state) is its file, its extern and its row below.
#include "base/check.h"
#include "kv/group_manager.h"

namespace pagoda::kv {

extern const GroupKind kFullAttentionKind;   // full_attention_group.cc
extern const GroupKind kSlidingWindowKind;   // sliding_window_group.cc
extern const GroupKind kRecurrentStateKind;  // recurrent_state_group.cc

namespace {
const GroupKind* const kKinds[] = {
    &kRecurrentStateKind,  // first: a state group's spec has sliding_window 0 too
    &kFullAttentionKind,
    &kSlidingWindowKind,
};
}  // namespace

std::unique_ptr<GroupManager> make_group_manager(const KvGroupSpec& spec, int32_t block_size, SharedBlocks* blocks) {
  for (const GroupKind* k : kKinds) {
    if (k->serves(spec)) return k->make(spec, block_size, blocks);
  }
  PAGODA_CHECK_MSG(false, "no KV group kind serves a group of sliding window %d", spec.sliding_window);
  return nullptr;
}

}  // namespace pagoda::kv
