// The Hadamard rotation of K/V below 8 bits through a real forward (issue 39,
// model/blocks.cc): for both kernel backends (cpu and the ref oracle), the K
// and V rows a q4_0 (iq4_nl, q5_1, mixed q8_0/q4_0) cache stores for layer 0
// are bitwise the quantization of the rotated f32 rows an f32 cache stores for
// the same tokens (layer 0's inputs do not depend on the cache type), with K's
// block the largest power of two >= 64 dividing head_dim and V's 64; q8_0 and
// f16 rows are not rotated; and the logits stay close to the f32 cache's (the
// attention output is rotated back: without that they are not).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "base/kv_dtype.h"
#include "common/mem_gguf.h"
#include "gguf/synth.h"
#include "gguf/writer.h"
#include "kernels/api.h"
#include "model/model.h"
#include "runtime/model_runner.h"
#include "sched/step_plan.h"

namespace pagoda {
namespace {

constexpr int32_t kBlock = 16;

struct RunOut {
  std::vector<uint8_t> k, v;  // layer 0's K and V rows of the prompt's tokens
  std::vector<float> logits;  // of the last token
};

RunOut run(const model::Model& m, KvTypes types, kernels::BackendKind backend, const std::vector<int32_t>& tokens) {
  runtime::RunnerOptions ro;
  ro.block_size = kBlock;
  ro.num_blocks = 4;
  ro.kv_dtype = types;
  ro.backend = backend;
  auto runner = runtime::ModelRunner::create(m, ro);
  EXPECT_TRUE(runner.ok()) << (runner.ok() ? "" : runner.message());
  if (!runner.ok()) return {};
  sched::StepPlan plan;
  plan.seqs.resize(1);
  sched::ScheduledSeq& q = plan.seqs[0];
  q.request_id = 1;
  q.wants_logits = true;
  q.start_pos = 0;
  q.token_ids = tokens;
  q.block_ids = {1};  // block 0 is the null block
  auto l = (*runner)->execute(plan);
  EXPECT_TRUE(l.ok()) << (l.ok() ? "" : l.message());
  if (!l.ok()) return {};
  RunOut out;
  out.logits.assign(l->row(0).begin(), l->row(0).end());
  const kernels::KvLayerView& kv = (*runner)->kv().layers()[0];
  const auto n = static_cast<size_t>(tokens.size());
  out.k.assign(kv.k + kBlock * kv.row_bytes, kv.k + kBlock * kv.row_bytes + n * kv.row_bytes);
  out.v.assign(kv.v + kBlock * kv.v_row_bytes, kv.v + kBlock * kv.v_row_bytes + n * kv.v_row_bytes);
  return out;
}

// The rows `types` would store for f32 rows k, v (n tokens of `row` values):
// rotated in blocks of rot_k / rot_v (0: not rotated), then encoded by kv_write.
void encode(const std::vector<uint8_t>& k_f32, const std::vector<uint8_t>& v_f32, int64_t row, int32_t n_kv,
            int32_t hd, KvTypes types, int32_t rot_k, int32_t rot_v, std::vector<uint8_t>* k_out,
            std::vector<uint8_t>* v_out) {
  const int64_t n = static_cast<int64_t>(k_f32.size() / sizeof(float)) / row;
  std::vector<float> k(static_cast<size_t>(n * row)), v(k.size());
  std::memcpy(k.data(), k_f32.data(), k_f32.size());
  std::memcpy(v.data(), v_f32.data(), v_f32.size());
  if (rot_k > 0) kernels::hadamard_rotate(k.data(), n * row, rot_k);
  if (rot_v > 0) kernels::hadamard_rotate(v.data(), n * row, rot_v);
  kernels::KvLayerView kv{nullptr, nullptr, types.k, kBlock, n_kv, hd, kv_row_bytes(types.k, row), 0, types.v,
                          kv_row_bytes(types.v, row)};
  k_out->assign(static_cast<size_t>(n) * kv.row_bytes, 0);
  v_out->assign(static_cast<size_t>(n) * kv.v_row_bytes, 0);
  kv.k = k_out->data();
  kv.v = v_out->data();
  std::vector<int64_t> slots(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) slots[t] = t;
  kernels::kv_write(kv, k.data(), v.data(), slots.data(), n);
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m;
}

void check(int64_t n_embd, int64_t n_head, int64_t n_head_kv, int32_t want_rot_k) {
  gguf::SynthOptions o;
  o.shape.name = "rot";
  o.shape.arch = "llama";
  o.shape.n_embd = n_embd;
  o.shape.n_layer = 2;
  o.shape.n_head = n_head;
  o.shape.n_head_kv = n_head_kv;
  o.shape.n_ff = 96;
  o.shape.n_vocab = 320;
  o.shape.n_ctx = 64;
  o.shape.weight_std = 0.05;
  o.type = GgmlType::F32;
  o.seed = 39;
  gguf::GgufWriter w;
  ASSERT_TRUE(gguf::synth_model(o, &w).ok());
  auto mem = testutil::to_memory(w);
  ASSERT_TRUE(mem.ok()) << mem.message();
  auto m = model::Model::from_gguf(mem->file);
  ASSERT_TRUE(m.ok()) << m.message();
  const model::ModelConfig& c = (*m)->config();
  const int32_t hd = c.head_dim, n_kv = c.n_kv_heads;
  const int64_t row = c.kv_dim();
  ASSERT_EQ(kv_rot_block_k(KvDtype::Q4_0, hd), want_rot_k);
  const std::vector<int32_t> tokens = {5, 300, 17, 17, 42, 100, 7, 250, 1, 99, 64};
  for (kernels::BackendKind backend : {kernels::BackendKind::Cpu, kernels::BackendKind::Ref}) {
    SCOPED_TRACE(backend == kernels::BackendKind::Ref ? "ref" : "cpu");
    const RunOut f32 = run(**m, KvTypes(KvDtype::F32), backend, tokens);
    ASSERT_EQ(f32.k.size(), tokens.size() * row * sizeof(float));
    double max_logit = 0;
    for (float x : f32.logits) max_logit = std::max(max_logit, std::fabs(static_cast<double>(x)));
    for (KvTypes t : {KvTypes(KvDtype::Q4_0), KvTypes(KvDtype::IQ4_NL), KvTypes(KvDtype::Q5_1),
                      KvTypes(KvDtype::Q8_0, KvDtype::Q4_0), KvTypes(KvDtype::Q4_0, KvDtype::F16),
                      KvTypes(KvDtype::Q8_0), KvTypes(KvDtype::F16)}) {
      SCOPED_TRACE(std::string(kv_dtype_name(t.k)) + "/" + kv_dtype_name(t.v));
      const int32_t rk = kv_rot_block_k(t.k, hd), rv = kv_rot_block_v(t.v, hd);
      EXPECT_EQ(rk, kv_dtype_rotated(t.k) ? want_rot_k : 0);
      EXPECT_EQ(rv, kv_dtype_rotated(t.v) ? 64 : 0);
      const RunOut got = run(**m, t, backend, tokens);
      std::vector<uint8_t> want_k, want_v, plain_k, plain_v;
      encode(f32.k, f32.v, row, n_kv, hd, t, rk, rv, &want_k, &want_v);
      EXPECT_EQ(got.k, want_k) << "layer 0's K rows are not the " << (rk ? "rotated" : "plain") << " encoding";
      EXPECT_EQ(got.v, want_v) << "layer 0's V rows are not the " << (rv ? "rotated" : "plain") << " encoding";
      encode(f32.k, f32.v, row, n_kv, hd, t, 0, 0, &plain_k, &plain_v);
      if (rk) {
        EXPECT_NE(got.k, plain_k) << "the rotation changes the stored K rows";
      }
      if (rv) {
        EXPECT_NE(got.v, plain_v) << "the rotation changes the stored V rows";
      }
      // The scores and the output are those of the unrotated attention, up to the
      // quantization: the logits stay near the f32 cache's.
      const double d = max_abs_diff(got.logits, f32.logits);
      std::printf("%s %s/%s head_dim %d: max |logit - f32 cache's| %.5f (max |logit| %.3f)\n",
                  backend == kernels::BackendKind::Ref ? "ref" : "cpu", kv_dtype_name(t.k), kv_dtype_name(t.v), hd, d,
                  max_logit);
      // (4-bit V on these random weights moves them by up to 12% of the largest.)
      EXPECT_LT(d, 0.2 * max_logit);
    }
  }
}

TEST(KvRotationModel, HeadDim64StoresRotatedRowsAndKeepsLogits) { check(128, 2, 1, 64); }
TEST(KvRotationModel, HeadDim128RotatesKIn128AndVIn64) { check(256, 2, 1, 128); }

}  // namespace
}  // namespace pagoda
