// The registered KV group kinds. A kind is one file, <kind>_group.cc, defining
// its GroupManager subclass and its `const GroupKind k...Kind` (CMake builds
// every src/kv/*_group.cc), and ONE line below: its name in PAGODA_KV_GROUP_KINDS,
// which declares it and lists it. The first kind whose serves() accepts a spec
// makes its manager, so order matters where specs overlap.
#include "base/check.h"
#include "kv/group_manager.h"

// clang-format off
#define PAGODA_KV_GROUP_KINDS(X)                                                          \
  X(kRecurrentStateKind)  /* recurrent_state_group.cc; first: its spec has window 0 too */ \
  X(kFullAttentionKind)   /* full_attention_group.cc */                                   \
  X(kSlidingWindowKind)   /* sliding_window_group.cc */
// clang-format on

namespace pagoda::kv {

#define PAGODA_KV_DECLARE_KIND(k) extern const GroupKind k;
PAGODA_KV_GROUP_KINDS(PAGODA_KV_DECLARE_KIND)
#undef PAGODA_KV_DECLARE_KIND

namespace {
#define PAGODA_KV_LIST_KIND(k) &k,
const GroupKind* const kKinds[] = {PAGODA_KV_GROUP_KINDS(PAGODA_KV_LIST_KIND)};
#undef PAGODA_KV_LIST_KIND
}  // namespace

std::unique_ptr<GroupManager> make_group_manager(const KvGroupSpec& spec, int32_t block_size, SharedBlocks* blocks) {
  for (const GroupKind* k : kKinds) {
    if (k->serves(spec)) return k->make(spec, block_size, blocks);
  }
  PAGODA_CHECK_MSG(false, "no KV group kind serves a group of sliding window %d", spec.sliding_window);
  return nullptr;
}

}  // namespace pagoda::kv
