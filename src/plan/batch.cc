#include "plan/batch.h"

namespace pagoda::plan {

kernels::BatchView StepBatch::view() const {
  kernels::BatchView v;
  v.n_tokens = n_tokens();
  v.n_seqs = n_seqs();
  v.token_ids = token_ids.data();
  v.positions = positions.data();
  v.slot_mapping = slot_mapping.data();
  v.q_indptr = q_indptr.data();
  v.kv_indptr = kv_indptr.data();
  v.kv_indices = kv_indices.data();
  v.kv_last_page_len = kv_last_page_len.data();
  v.n_logits = n_logits();
  v.logit_rows = logit_rows.data();
  v.n_groups = static_cast<int32_t>(groups.size()) + 1;
  v.groups = group_views.empty() ? nullptr : group_views.data();
  return v;
}

namespace {

void clear(StepBatch* b) {
  b->token_ids.clear();
  b->positions.clear();
  b->slot_mapping.clear();
  b->q_indptr.clear();
  b->kv_indptr.clear();
  b->kv_indices.clear();
  b->kv_last_page_len.clear();
  b->logit_rows.clear();
  b->logit_seqs.clear();
  for (auto& g : b->groups) {  // keep the vectors' capacity
    g.slot_mapping.clear();
    g.kv_indices.clear();
  }
  b->group_views.clear();
}

Status check_table(const sched::ScheduledSeq& s, const std::vector<sched::BlockId>& table, int64_t pages,
                   int64_t kv_len, int32_t num_blocks) {
  if (static_cast<int64_t>(table.size()) < pages) {
    return errorf("plan: request %llu needs %lld blocks for %lld tokens, block table has %zu",
                  static_cast<unsigned long long>(s.request_id), static_cast<long long>(pages),
                  static_cast<long long>(kv_len), table.size());
  }
  for (int64_t p = 0; p < pages; ++p) {
    const sched::BlockId b = table[static_cast<size_t>(p)];
    if (b < 0 || b >= num_blocks) {
      return errorf("plan: request %llu block %d outside the KV storage of %d blocks",
                    static_cast<unsigned long long>(s.request_id), b, num_blocks);
    }
  }
  return Status::Ok();
}

Status check_seq(const sched::ScheduledSeq& s, size_t index, int32_t block_size, int32_t num_blocks,
                 int32_t num_groups, int32_t state_group) {
  const int64_t n = static_cast<int64_t>(s.token_ids.size());
  if (n == 0) return errorf("plan: sequence %zu (request %llu) has no new tokens", index,
                            static_cast<unsigned long long>(s.request_id));
  if (s.start_pos < 0) return errorf("plan: sequence %zu has start_pos %d", index, s.start_pos);
  if (s.num_draft_tokens < 0 || s.num_draft_tokens >= n || (s.num_draft_tokens > 0 && !s.wants_logits)) {
    return errorf("plan: sequence %zu has %d draft tokens among %lld new tokens%s", index, s.num_draft_tokens,
                  static_cast<long long>(n), s.wants_logits ? "" : " without logits");
  }
  const int64_t kv_len = static_cast<int64_t>(s.start_pos) + n;
  if (kv_len > INT32_MAX) return errorf("plan: sequence %zu is longer than 2^31 tokens", index);
  const int64_t pages = (kv_len + block_size - 1) / block_size;
  PAGODA_TRY(check_table(s, s.block_ids, pages, kv_len, num_blocks));
  if (static_cast<int64_t>(s.group_block_ids.size()) != num_groups - 1) {
    return errorf("plan: request %llu has %zu group tables, the storage has %d groups",
                  static_cast<unsigned long long>(s.request_id), s.group_block_ids.size() + 1, num_groups);
  }
  for (size_t g = 0; g < s.group_block_ids.size(); ++g) {
    const auto& table = s.group_block_ids[g];
    if (static_cast<int32_t>(g) + 1 == state_group) {  // the recurrent state's blocks
      for (sched::BlockId b : table) {
        if (b <= 0 || b >= num_blocks)
          return errorf("plan: request %llu has recurrent state block %d outside 1..%d",
                        static_cast<unsigned long long>(s.request_id), b, num_blocks - 1);
      }
      continue;
    }
    PAGODA_TRY(check_table(s, table, pages, kv_len, num_blocks));
    // The new tokens' K/V go to real blocks of every group.
    for (int64_t p = s.start_pos / block_size; p < pages; ++p) {
      if (table[static_cast<size_t>(p)] == 0) {
        return errorf("plan: request %llu writes position %lld into the null block of a KV group",
                      static_cast<unsigned long long>(s.request_id), static_cast<long long>(p * block_size));
      }
    }
  }
  return Status::Ok();
}

}  // namespace

Status build_batch(const sched::StepPlan& plan, int32_t block_size, int32_t num_blocks, StepBatch* out,
                   int32_t num_groups, int32_t state_group) {
  clear(out);
  out->block_size = block_size;
  if (block_size <= 0) return errorf("plan: block size %d must be positive", block_size);
  if (num_groups < 1) return errorf("plan: %d KV groups", num_groups);
  int64_t total = 0;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    PAGODA_TRY(check_seq(plan.seqs[i], i, block_size, num_blocks, num_groups, state_group));
    total += static_cast<int64_t>(plan.seqs[i].token_ids.size());
  }
  if (total > INT32_MAX) return errorf("plan: %lld tokens in one step", static_cast<long long>(total));

  const auto n_seqs = plan.seqs.size();
  out->token_ids.reserve(static_cast<size_t>(total));
  out->positions.reserve(static_cast<size_t>(total));
  out->slot_mapping.reserve(static_cast<size_t>(total));
  out->q_indptr.reserve(n_seqs + 1);
  out->kv_indptr.reserve(n_seqs + 1);
  out->kv_last_page_len.reserve(n_seqs);
  out->q_indptr.push_back(0);
  out->kv_indptr.push_back(0);
  out->groups.resize(static_cast<size_t>(num_groups - 1));
  for (size_t i = 0; i < n_seqs; ++i) {
    const sched::ScheduledSeq& s = plan.seqs[i];
    const auto n = static_cast<int32_t>(s.token_ids.size());
    for (int32_t j = 0; j < n; ++j) {
      const int32_t pos = s.start_pos + j;
      out->token_ids.push_back(s.token_ids[static_cast<size_t>(j)]);
      out->positions.push_back(pos);
      out->slot_mapping.push_back(static_cast<int64_t>(s.block_ids[static_cast<size_t>(pos / block_size)]) *
                                      block_size + pos % block_size);
      for (size_t g = 0; g < s.group_block_ids.size(); ++g) {
        if (static_cast<int32_t>(g) + 1 == state_group) continue;
        out->groups[g].slot_mapping.push_back(
            static_cast<int64_t>(s.group_block_ids[g][static_cast<size_t>(pos / block_size)]) * block_size +
            pos % block_size);
      }
    }
    out->q_indptr.push_back(out->q_indptr.back() + n);
    const int32_t kv_len = s.start_pos + n;
    const int32_t pages = (kv_len + block_size - 1) / block_size;
    out->kv_indices.insert(out->kv_indices.end(), s.block_ids.begin(), s.block_ids.begin() + pages);
    for (size_t g = 0; g < s.group_block_ids.size(); ++g) {
      if (static_cast<int32_t>(g) + 1 == state_group) continue;
      const auto& t = s.group_block_ids[g];
      out->groups[g].kv_indices.insert(out->groups[g].kv_indices.end(), t.begin(), t.begin() + pages);
    }
    out->kv_indptr.push_back(out->kv_indptr.back() + pages);
    out->kv_last_page_len.push_back(kv_len - (pages - 1) * block_size);
    if (s.wants_logits) {  // the last row; with drafts, the row before each draft too (verification)
      for (int32_t j = s.num_draft_tokens; j >= 0; --j) {
        out->logit_rows.push_back(out->q_indptr.back() - 1 - j);
        out->logit_seqs.push_back(static_cast<int32_t>(i));
      }
    }
  }
  for (const auto& g : out->groups) out->group_views.push_back({g.slot_mapping.data(), g.kv_indices.data()});
  return Status::Ok();
}

}  // namespace pagoda::plan
