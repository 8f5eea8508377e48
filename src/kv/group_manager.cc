#include "kv/group_manager.h"

#include <algorithm>

#include "base/check.h"

namespace pagoda::kv {

BlockId SharedBlocks::take() {
  const BlockId b = pool.pop_free();
  const bool head = checkpoint_head[static_cast<size_t>(b)] != 0;
  checkpoint_head[static_cast<size_t>(b)] = 0;
  if (cache.contains(b)) {
    evicted.record(cache.key_of(b));
    cache.erase(b);
    ++num_evictions;
    if (head) ++num_checkpoint_evictions;
  }
  return b;
}

const GroupManager::Table& GroupManager::ref(SeqId seq) const {
  auto it = tables_.find(seq);
  PAGODA_CHECK_MSG(it != tables_.end(), "unknown sequence %llu", static_cast<unsigned long long>(seq));
  return it->second;
}

GroupManager::Table& GroupManager::mut(SeqId seq) { return const_cast<Table&>(ref(seq)); }

int32_t GroupManager::held_alone(const Table& t, int32_t from, int32_t to) const {
  int32_t n = 0;
  for (int32_t i = from; i < to; ++i) {
    const BlockId b = t.blocks[static_cast<size_t>(i)];
    n += b != kNullBlock && pool().ref_count(b) == 1 ? 1 : 0;
  }
  return n;
}

void GroupManager::adopt(SeqId seq, std::span<const BlockId> hit, int32_t first_live) {
  PAGODA_CHECK_MSG(!has(seq), "sequence %llu already has a table", static_cast<unsigned long long>(seq));
  for (BlockId b : hit) {
    if (b != kNullBlock) pool().incref(b);
  }
  tables_.emplace(seq, Table{{hit.begin(), hit.end()}, first_live});
}

void GroupManager::grow(SeqId seq, int32_t num_entries) {
  auto& blocks = mut(seq).blocks;
  while (static_cast<int32_t>(blocks.size()) < num_entries) blocks.push_back(blocks_->take());
}

int32_t GroupManager::shared_blocks(SeqId seq, int32_t from, int32_t to) const {
  const Table& t = ref(seq);
  int32_t n = 0;
  for (int32_t j = from; j < std::min(to, static_cast<int32_t>(t.blocks.size())); ++j) {
    n += pool().ref_count(t.blocks[static_cast<size_t>(j)]) > 1 ? 1 : 0;
  }
  return n;
}

void GroupManager::copy_on_write(SeqId seq, int32_t from, int32_t to, int32_t num_computed,
                                 std::vector<BlockCopy>* copies) {
  auto& blocks = mut(seq).blocks;
  const int32_t end = std::min(static_cast<int32_t>(blocks.size()), to);
  for (int32_t j = from; j < end; ++j) {
    BlockId& slot = blocks[static_cast<size_t>(j)];
    if (pool().ref_count(slot) <= 1) continue;
    const BlockId dst = blocks_->take();
    // Only computed tokens need copying; a block past them is just unshared.
    if (entry_computed(j, num_computed)) {
      PAGODA_CHECK(copies != nullptr);
      copies->emplace_back(slot, dst);
      ++blocks_->num_cow_copies;
    }
    pool().decref(slot);  // still > 0: another sequence holds it
    slot = dst;
  }
}

void GroupManager::fork(SeqId parent, SeqId child) {
  Table copy = ref(parent);
  PAGODA_CHECK_MSG(!has(child), "sequence %llu already has a table", static_cast<unsigned long long>(child));
  for (BlockId b : copy.blocks) {
    if (b != kNullBlock) pool().incref(b);
  }
  tables_.emplace(child, std::move(copy));
}

void GroupManager::free(SeqId seq) {
  const auto& blocks = ref(seq).blocks;
  for (auto b = blocks.rbegin(); b != blocks.rend(); ++b) {
    if (*b != kNullBlock) pool().decref(*b);
  }
  tables_.erase(seq);
}

void GroupManager::truncate(SeqId seq, int32_t num_entries) {
  auto& blocks = mut(seq).blocks;
  while (static_cast<int32_t>(blocks.size()) > num_entries) {
    if (blocks.back() != kNullBlock) pool().decref(blocks.back());
    blocks.pop_back();
  }
}

bool GroupManager::holds(SeqId seq, int32_t from, int32_t to) const {
  const auto& blocks = ref(seq).blocks;
  for (int32_t i = from; i < to; ++i) {
    if (blocks[static_cast<size_t>(i)] == kNullBlock) return false;
  }
  return true;
}

}  // namespace pagoda::kv
