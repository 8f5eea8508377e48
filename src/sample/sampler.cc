#include "sample/sampler.h"

#include <immintrin.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <limits>
#include <numeric>

namespace pagoda::sample {

namespace {

int32_t argmax_scalar(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[static_cast<size_t>(best)]) best = static_cast<int32_t>(i);
  }
  return best;
}

}  // namespace

// The first index of the largest value, as the scalar loop above: 8 lanes each
// keep their first maximum (strict >), then the lanes' maxima are merged, ties
// to the lowest index. A NaN anywhere (which the scalar loop skips, or sticks
// to at index 0) takes the scalar loop, so the answer is always its answer.
int32_t argmax(std::span<const float> logits) {
  const size_t n = logits.size();
  if (n < 16 || n > static_cast<size_t>(INT32_MAX)) return argmax_scalar(logits);
  const float* l = logits.data();
  __m256 best = _mm256_loadu_ps(l);
  __m256i best_i = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), idx = best_i;
  __m256 nan = _mm256_cmp_ps(best, best, _CMP_UNORD_Q);
  const __m256i step = _mm256_set1_epi32(8);
  size_t i = 8;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(l + i);
    idx = _mm256_add_epi32(idx, step);
    const __m256 gt = _mm256_cmp_ps(v, best, _CMP_GT_OQ);
    best = _mm256_blendv_ps(best, v, gt);
    best_i = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(best_i), _mm256_castsi256_ps(idx), gt));
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  }
  if (_mm256_movemask_ps(nan) != 0) return argmax_scalar(logits);
  alignas(32) float bv[8];
  alignas(32) int32_t bi[8];
  _mm256_store_ps(bv, best);
  _mm256_store_si256(reinterpret_cast<__m256i*>(bi), best_i);
  int32_t r = bi[0];
  float m = bv[0];
  for (int j = 1; j < 8; ++j) {
    if (bv[j] > m || (bv[j] == m && bi[j] < r)) {
      m = bv[j];
      r = bi[j];
    }
  }
  for (; i < n; ++i) {
    if (std::isnan(l[i])) return argmax_scalar(logits);
    if (l[i] > m) {
      m = l[i];
      r = static_cast<int32_t>(i);
    }
  }
  return r;
}

bool mask_allows_any(std::span<const uint32_t> allowed, size_t n) {
  const size_t full = std::min(allowed.size(), n / 32);
  for (size_t w = 0; w < full; ++w)
    if (allowed[w]) return true;
  if (full < allowed.size() && n % 32) return (allowed[full] & ((uint32_t{1} << (n % 32)) - 1)) != 0;
  return false;
}

Sampler::Sampler(SamplingParams params, std::span<const int32_t> prompt_tokens)
    : params_(std::move(params)), rng_(params_.seed) {
  // Only the repetition penalty reads the prompt (through seen_; the others
  // count generated tokens): without it the sampler keeps no copy of it.
  if (has_repetition_penalty()) prompt_.assign(prompt_tokens.begin(), prompt_tokens.end());
}

void Sampler::ensure_vocab(size_t n) {
  if (counts_.size() == n) return;
  counts_.assign(n, 0);
  seen_.assign(n, 0);
  for (int32_t t : prompt_) {
    if (t >= 0 && static_cast<size_t>(t) < n) seen_[static_cast<size_t>(t)] = 1;
  }
  for (int32_t t : generated_) {
    if (t >= 0 && static_cast<size_t>(t) < n) {
      seen_[static_cast<size_t>(t)] = 1;
      ++counts_[static_cast<size_t>(t)];
    }
  }
}

void Sampler::accept(int32_t token) {
  generated_.push_back(token);
  if (token >= 0 && static_cast<size_t>(token) < counts_.size()) {
    seen_[static_cast<size_t>(token)] = 1;
    ++counts_[static_cast<size_t>(token)];
  }
}

bool Sampler::has_repetition_penalty() const {
  const float rp = params_.repetition_penalty;
  return rp != 1.0f && rp > 0.0f;
}

bool Sampler::has_penalties() const {
  return has_repetition_penalty() || params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f;
}

void Sampler::apply_penalties(std::span<float> l) {
  if (!has_penalties()) return;
  const float rp = params_.repetition_penalty;
  const float pres = params_.presence_penalty, freq = params_.frequency_penalty;
  const bool rep = has_repetition_penalty();
  for (size_t i = 0; i < l.size(); ++i) {
    if (!seen_[i]) continue;
    if (rep) l[i] = l[i] > 0 ? l[i] / rp : l[i] * rp;
    if (counts_[i] > 0) l[i] -= freq * static_cast<float>(counts_[i]) + pres;
  }
}

namespace {

// Orders ids by value descending, ties by lowest id.
struct ByValueDesc {
  const float* v;
  bool operator()(int32_t a, int32_t b) const { return v[a] > v[b] || (v[a] == v[b] && a < b); }
};

}  // namespace

void Sampler::prepare(std::span<const float> logits, std::span<const uint32_t> allowed) {
  const size_t n = logits.size();
  ensure_vocab(n);
  work_.assign(logits.begin(), logits.end());
  if (!allowed.empty()) {
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    // Word at a time: a fully allowed or fully refused word of 32 tokens costs one test.
    for (size_t w = 0; w * 32 < n; ++w) {
      const uint32_t bits = w < allowed.size() ? allowed[w] : 0;
      if (bits == ~uint32_t{0}) continue;
      const size_t end = std::min(n, w * 32 + 32);
      for (size_t i = w * 32; i < end; ++i)
        if (!((bits >> (i - w * 32)) & 1)) work_[i] = kNegInf;
    }
  }
  for (const auto& [id, bias] : params_.logit_bias)
    if (id >= 0 && static_cast<size_t>(id) < n) work_[static_cast<size_t>(id)] += bias;
  apply_penalties(work_);
}

bool Sampler::greedy() const { return !(params_.temperature > 0.0f) || params_.top_k == 1; }

double Sampler::distribution(bool constrained) {
  const size_t n = work_.size();
  const float* l = work_.data();
  cand_.resize(n);
  std::iota(cand_.begin(), cand_.end(), 0);
  // Constrained: only allowed tokens are candidates (the draw's fallback,
  // cand_.back(), must be one of them too).
  if (constrained) std::erase_if(cand_, [&](int32_t id) { return std::isinf(l[id]) && l[id] < 0; });
  bool sorted = false;
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < n) {
    const auto k = static_cast<size_t>(params_.top_k);
    std::partial_sort(cand_.begin(), cand_.begin() + static_cast<ptrdiff_t>(k), cand_.end(), ByValueDesc{l});
    cand_.resize(k);
    sorted = true;
  }
  if (params_.top_p < 1.0f) {
    if (!sorted) std::sort(cand_.begin(), cand_.end(), ByValueDesc{l});
    sorted = true;
    const float mx = l[cand_[0]];
    double sum = 0;
    for (int32_t id : cand_) sum += std::exp(static_cast<double>(l[id] - mx));
    double cum = 0;
    size_t keep = cand_.size();
    for (size_t i = 0; i < cand_.size(); ++i) {
      cum += std::exp(static_cast<double>(l[cand_[i]] - mx)) / sum;
      if (cum >= params_.top_p) {
        keep = i + 1;
        break;
      }
    }
    cand_.resize(keep);
  }
  if (params_.min_p > 0.0f) {
    float mx = -std::numeric_limits<float>::infinity();
    for (int32_t id : cand_) mx = std::max(mx, l[id]);
    const float threshold = mx + std::log(params_.min_p);  // p >= min_p * p_max
    std::erase_if(cand_, [&](int32_t id) { return l[id] < threshold; });
  }
  // Temperature, softmax weights over the survivors.
  const float inv_t = 1.0f / params_.temperature;
  float mx = -std::numeric_limits<float>::infinity();
  for (int32_t id : cand_) mx = std::max(mx, l[id]);
  probs_.resize(cand_.size());
  double sum = 0;
  for (size_t i = 0; i < cand_.size(); ++i) {
    probs_[i] = std::exp((l[cand_[i]] - mx) * inv_t);
    sum += probs_[i];
  }
  return sum;
}

int32_t Sampler::draw(double sum) {
  const double u = rng_.uniform() * sum;
  double acc = 0;
  int32_t token = cand_.back();
  for (size_t i = 0; i < cand_.size(); ++i) {
    acc += probs_[i];
    if (u < acc) {
      token = cand_[i];
      break;
    }
  }
  return token;
}

Sampler::VerifyResult Sampler::verify(std::span<const float> logits, int32_t draft) {
  prepare(logits, {});
  VerifyResult v;
  if (greedy()) {
    v.token = argmax(work_);
  } else {
    double sum = distribution(false);
    double p_draft = 0;
    size_t at = cand_.size();
    for (size_t i = 0; i < cand_.size(); ++i) {
      if (cand_[i] == draft) {
        p_draft = probs_[i];
        at = i;
      }
    }
    // Accept with probability p(draft) (q is a point mass on the draft, so
    // min(1, p/q) = p); else draw from p without the draft, renormalised.
    if (at < cand_.size() && rng_.uniform() * sum < p_draft) {
      v.token = draft;
    } else {
      if (at < cand_.size()) {
        sum -= probs_[at];
        cand_.erase(cand_.begin() + static_cast<ptrdiff_t>(at));
        probs_.erase(probs_.begin() + static_cast<ptrdiff_t>(at));
      }
      // The draft was the only candidate: p(draft) = 1 accepted it above.
      v.token = cand_.empty() ? draft : draw(sum);
    }
  }
  v.accepted = v.token == draft;
  accept(v.token);
  return v;
}

SampleResult Sampler::sample(std::span<const float> logits, std::span<const uint32_t> allowed) {
  const size_t n = logits.size();
  if (greedy() && allowed.empty() && !has_penalties() && !params_.logprobs && params_.logit_bias.empty()) {
    // Plain greedy: prepare() would copy the logits unchanged; take their argmax.
    ensure_vocab(n);
    SampleResult r;
    r.token = argmax(logits);
    accept(r.token);
    return r;
  }
  prepare(logits, allowed);
  const float* l = work_.data();
  SampleResult r;
  if (greedy()) {
    r.token = argmax(work_);
  } else {
    r.token = draw(distribution(!allowed.empty()));
  }

  if (params_.logprobs) {
    // log-softmax of the processed logits (temperature-scaled when sampling).
    const double inv_t = params_.temperature > 0.0f ? 1.0 / params_.temperature : 1.0;
    const float mx = l[argmax(work_)];
    double sum = 0;
    for (size_t i = 0; i < n; ++i) sum += std::exp((static_cast<double>(l[i]) - mx) * inv_t);
    const double log_z = std::log(sum);
    auto logprob = [&](int32_t id) {
      return static_cast<float>((static_cast<double>(l[id]) - mx) * inv_t - log_z);
    };
    r.logprob = logprob(r.token);
    const size_t k = std::min(n, static_cast<size_t>(std::max(0, params_.top_logprobs)));
    if (k > 0) {
      cand_.resize(n);
      std::iota(cand_.begin(), cand_.end(), 0);
      std::partial_sort(cand_.begin(), cand_.begin() + static_cast<ptrdiff_t>(k), cand_.end(), ByValueDesc{l});
      for (size_t i = 0; i < k; ++i) r.top.emplace_back(cand_[i], logprob(cand_[i]));
    }
  }
  accept(r.token);
  return r;
}

}  // namespace pagoda::sample
