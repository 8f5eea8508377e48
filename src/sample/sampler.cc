#include "sample/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace pagoda::sample {

int32_t argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[static_cast<size_t>(best)]) best = static_cast<int32_t>(i);
  }
  return best;
}

bool mask_allows_any(std::span<const uint32_t> allowed, size_t n) {
  const size_t full = std::min(allowed.size(), n / 32);
  for (size_t w = 0; w < full; ++w)
    if (allowed[w]) return true;
  if (full < allowed.size() && n % 32) return (allowed[full] & ((uint32_t{1} << (n % 32)) - 1)) != 0;
  return false;
}

Sampler::Sampler(SamplingParams params, std::span<const int32_t> prompt_tokens)
    : params_(std::move(params)), rng_(params_.seed), prompt_(prompt_tokens.begin(), prompt_tokens.end()) {}

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

void Sampler::apply_penalties(std::span<float> l) {
  const float rp = params_.repetition_penalty;
  const float pres = params_.presence_penalty, freq = params_.frequency_penalty;
  const bool rep = rp != 1.0f && rp > 0.0f;
  if (!rep && pres == 0.0f && freq == 0.0f) return;
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
