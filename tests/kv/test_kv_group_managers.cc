// One GroupManager per KV group kind, alone over its SharedBlocks: exact block
// ids after allocate (adopt + grow), append (grow), release, fork, copy-on-write,
// truncate and free, and each kind's reservation and release rules. The free
// queue of a fresh pool of n blocks is 1..n-1, popped from the head.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kv/group_manager.h"
#include "kv/test_util.h"

namespace pagoda::kv {
namespace {

using testing::Ids;

Ids table(const GroupManager& g, SeqId s) {
  auto t = g.table(s);
  return Ids(t.begin(), t.end());
}

TEST(KvGroupKinds, RegistryPicksTheKindOfEachSpec) {
  SharedBlocks blocks(4, 1);
  EXPECT_EQ(std::string(make_group_manager(KvGroupSpec{0}, 4, &blocks)->kind()), "full");
  EXPECT_EQ(std::string(make_group_manager(KvGroupSpec{1}, 4, &blocks)->kind()), "sliding_window");
  EXPECT_EQ(std::string(make_group_manager(KvGroupSpec{512}, 16, &blocks)->kind()), "sliding_window");
  // The KvManager coordinates one manager per configured group, in order.
  KvConfig c = testing::make_config(8, 4);
  c.groups = {KvGroupSpec{0}, KvGroupSpec{8}, KvGroupSpec{0}};
  KvManager kv(c);
  ASSERT_EQ(kv.num_groups(), 3);
  EXPECT_EQ(std::string(kv.group(0).kind()), "full");
  EXPECT_EQ(std::string(kv.group(1).kind()), "sliding_window");
  EXPECT_EQ(kv.group(1).spec().sliding_window, 8);
  EXPECT_EQ(std::string(kv.group(2).kind()), "full");
}

TEST(KvGroupKinds, FullAttentionBlockIds) {
  SharedBlocks blocks(10, 1);
  auto g = make_group_manager(KvGroupSpec{0}, 4, &blocks);
  const BlockPool& pool = blocks.pool;
  // Allocate: no hit, 3 entries.
  g->adopt(1, {}, 0);
  g->grow(1, 3);
  EXPECT_EQ(table(*g, 1), (Ids{1, 2, 3}));
  // Append: one more entry.
  g->grow(1, 4);
  EXPECT_EQ(table(*g, 1), (Ids{1, 2, 3, 4}));
  // Release rule: a full group reads every entry and gives none back.
  EXPECT_EQ(g->first_needed_block(1000), 0);
  EXPECT_EQ(g->releasable_blocks(1, 1000), 0);
  g->release_before(1, 1000);
  EXPECT_EQ(table(*g, 1), (Ids{1, 2, 3, 4}));
  EXPECT_EQ(g->first_live(1), 0);
  // Reservation rule: the whole table counts, against ceil(N / bs).
  EXPECT_EQ(g->held_blocks(1), 4);
  EXPECT_EQ(g->peak_blocks(10, 1), 3);
  EXPECT_EQ(g->peak_blocks(10, 512), 3);
  EXPECT_EQ(g->held_after_allocate(Ids{0, 7}, 1, 5), 5);
  // Fork: the child shares every block.
  g->fork(1, 2);
  EXPECT_EQ(table(*g, 2), (Ids{1, 2, 3, 4}));
  EXPECT_EQ(pool.ref_count(1), 2);
  EXPECT_EQ(g->shared_blocks(2, 0, 4), 4);
  EXPECT_EQ(g->held_blocks(2), 4);  // shared or not
  // Copy-on-write of entry 3 (tokens 12..15, 13 computed): block 4 -> 5, copied.
  std::vector<BlockCopy> copies;
  g->copy_on_write(2, 3, 4, 13, &copies);
  EXPECT_EQ(table(*g, 2), (Ids{1, 2, 3, 5}));
  EXPECT_EQ(copies, (std::vector<BlockCopy>{{4, 5}}));
  EXPECT_EQ(blocks.num_cow_copies, 1);
  EXPECT_EQ(pool.ref_count(4), 1);
  // Free: last block first onto the free queue.
  g->free(2);
  EXPECT_FALSE(g->has(2));
  EXPECT_EQ(pool.free_queue(), (Ids{6, 7, 8, 9, 5}));
  // Truncate to 2 entries: 4 then 3 go back.
  g->truncate(1, 2);
  EXPECT_EQ(table(*g, 1), (Ids{1, 2}));
  EXPECT_EQ(pool.free_queue(), (Ids{6, 7, 8, 9, 5, 4, 3}));
  EXPECT_TRUE(g->holds(1, 0, 2));
  g->free(1);
  EXPECT_EQ(pool.free_queue(), (Ids{6, 7, 8, 9, 5, 4, 3, 2, 1}));
  EXPECT_EQ(pool.check(), "");
}

TEST(KvGroupKinds, SlidingWindowBlockIds) {
  // Window 8, blocks of 4: a step from position p reads keys p - 7 .. p.
  SharedBlocks blocks(10, 1);
  auto g = make_group_manager(KvGroupSpec{8}, 4, &blocks);
  const BlockPool& pool = blocks.pool;
  EXPECT_EQ(g->first_needed_block(7), 0);
  EXPECT_EQ(g->first_needed_block(12), 1);  // key 5
  EXPECT_EQ(g->first_needed_block(16), 2);  // key 9
  // Allocate 3 entries.
  g->adopt(1, {}, 0);
  g->grow(1, 3);
  EXPECT_EQ(table(*g, 1), (Ids{1, 2, 3}));
  // Release before a step from 12: entry 0 (tokens 0..3) goes back.
  EXPECT_EQ(g->releasable_blocks(1, 12), 1);
  g->release_before(1, 12);
  EXPECT_EQ(table(*g, 1), (Ids{0, 2, 3}));
  EXPECT_EQ(g->first_live(1), 1);
  EXPECT_EQ(pool.free_queue(), (Ids{4, 5, 6, 7, 8, 9, 1}));
  // Append one entry: the head of the free queue.
  g->grow(1, 4);
  EXPECT_EQ(table(*g, 1), (Ids{0, 2, 3, 4}));
  EXPECT_EQ(g->held_blocks(1), 3);
  // Fork: the child shares the live blocks and the null entry.
  g->fork(1, 2);
  EXPECT_EQ(table(*g, 2), (Ids{0, 2, 3, 4}));
  EXPECT_EQ(g->first_live(2), 1);
  EXPECT_EQ(pool.ref_count(2), 2);
  // Reservation rule: only blocks held alone count (releasing a shared one frees nothing).
  EXPECT_EQ(g->held_blocks(1), 0);
  // Release before 16: entry 1 is shared, so nothing reaches the free queue.
  EXPECT_EQ(g->releasable_blocks(1, 16), 0);
  g->release_before(1, 16);
  EXPECT_EQ(table(*g, 1), (Ids{0, 0, 3, 4}));
  EXPECT_EQ(g->first_live(1), 2);
  EXPECT_EQ(pool.ref_count(2), 1);
  EXPECT_EQ(g->held_blocks(2), 1);  // block 2, now its alone
  EXPECT_FALSE(g->holds(1, 1, 4));
  EXPECT_TRUE(g->holds(1, 2, 4));
  // Peak: min(ceil(N / bs), ceil((W + chunk - 2) / bs) + 1).
  EXPECT_EQ(g->peak_blocks(100, 1), 3);
  EXPECT_EQ(g->peak_blocks(100, 5), 4);
  EXPECT_EQ(g->peak_blocks(6, 64), 2);
  // A new sequence from hit {0, 2} (first live entry 1) grown to 3 entries:
  // the null entry and the hit another sequence holds do not count.
  EXPECT_EQ(g->held_after_allocate(Ids{0, 2}, 1, 3), 1);
  // Copy-on-write of entries 2..3 with 10 computed tokens: block 3 (tokens
  // 8..11) is copied to 5; block 4 (12..15) holds none, so 6 takes it uncopied.
  std::vector<BlockCopy> copies;
  g->copy_on_write(2, 2, 4, 10, &copies);
  EXPECT_EQ(table(*g, 2), (Ids{0, 2, 5, 6}));
  EXPECT_EQ(copies, (std::vector<BlockCopy>{{3, 5}}));
  EXPECT_EQ(blocks.num_cow_copies, 1);
  // Free the child: last block first.
  g->free(2);
  EXPECT_EQ(pool.free_queue(), (Ids{7, 8, 9, 1, 6, 5, 2}));
  // Truncate to 3 entries, then free.
  g->truncate(1, 3);
  EXPECT_EQ(table(*g, 1), (Ids{0, 0, 3}));
  g->free(1);
  EXPECT_EQ(pool.free_queue(), (Ids{7, 8, 9, 1, 6, 5, 2, 4, 3}));
  EXPECT_EQ(pool.check(), "");
}

TEST(KvGroupKinds, AdoptTouchesHitsAndTakeEvictsKeys) {
  // A hit on a free cached block leaves the free queue; a fresh block popped
  // from the queue loses its key (an eviction).
  SharedBlocks blocks(5, 1);
  const std::vector<TokenId> toks{1, 2, 3, 4};
  const Hash128 k1 = blocks.cache.key({}, toks, "");
  ASSERT_NE(blocks.cache.insert(1, k1, kRootEntry, toks, ""), kNoEntry);
  const std::vector<TokenId> toks2{5, 6, 7, 8};
  ASSERT_NE(blocks.cache.insert(2, blocks.cache.key({}, toks2, ""), kRootEntry, toks2, ""), kNoEntry);
  auto g = make_group_manager(KvGroupSpec{8}, 4, &blocks);
  g->adopt(7, Ids{0, 1}, 1);  // a window hit: entry 0 null, entry 1 block 1
  EXPECT_EQ(blocks.pool.ref_count(1), 1);
  EXPECT_EQ(blocks.pool.free_queue(), (Ids{2, 3, 4}));
  g->grow(7, 3);
  EXPECT_EQ(table(*g, 7), (Ids{0, 1, 2}));
  EXPECT_EQ(blocks.num_evictions, 1);
  EXPECT_FALSE(blocks.cache.contains(2));
  EXPECT_TRUE(blocks.cache.contains(1));
}

}  // namespace
}  // namespace pagoda::kv
