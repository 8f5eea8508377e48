#include "router/ring.h"

#include <algorithm>

#include "base/hash.h"

namespace pagoda::router {

std::optional<uint64_t> prefix_key(const std::vector<int32_t>& tokens, int block_size, int max_blocks) {
  const size_t bs = static_cast<size_t>(block_size);
  const size_t blocks = std::min(tokens.size() / bs, static_cast<size_t>(max_blocks));
  if (blocks == 0) return std::nullopt;
  uint64_t h = 0x70616730646121ull;  // any fixed seed: keys are only compared within one router
  for (size_t b = 0; b < blocks; ++b) h = xxh3_64(tokens.data() + b * bs, bs * sizeof(int32_t), h);
  return h;
}

HashRing::HashRing(const std::vector<std::string>& names, int vnodes) : num_replicas_(static_cast<int>(names.size())) {
  points_.reserve(names.size() * static_cast<size_t>(std::max(1, vnodes)));
  for (size_t r = 0; r < names.size(); ++r) {
    for (int v = 0; v < std::max(1, vnodes); ++v) {
      const std::string p = names[r] + "#" + std::to_string(v);
      points_.push_back({xxh3_64(p.data(), p.size()), static_cast<int>(r)});
    }
  }
  // Ties (equal hashes) are ordered by replica, so the ring does not depend on sort stability.
  std::sort(points_.begin(), points_.end(),
            [](const Point& a, const Point& b) { return a.hash != b.hash ? a.hash < b.hash : a.replica < b.replica; });
}

std::vector<int> HashRing::walk(uint64_t key) const {
  std::vector<int> order;
  if (points_.empty()) return order;
  std::vector<bool> seen(static_cast<size_t>(num_replicas_), false);
  auto it = std::lower_bound(points_.begin(), points_.end(), key, [](const Point& p, uint64_t k) { return p.hash < k; });
  size_t i = static_cast<size_t>(it - points_.begin());
  for (size_t n = 0; n < points_.size() && static_cast<int>(order.size()) < num_replicas_; ++n) {
    const Point& p = points_[(i + n) % points_.size()];
    if (!seen[static_cast<size_t>(p.replica)]) {
      seen[static_cast<size_t>(p.replica)] = true;
      order.push_back(p.replica);
    }
  }
  return order;
}

const char* route_kind_name(RouteKind k) {
  switch (k) {
    case RouteKind::kAffinity: return "affinity";
    case RouteKind::kFallback: return "fallback";
    case RouteKind::kLeastLoaded: return "least_loaded";
    case RouteKind::kRoundRobin: return "round_robin";
    case RouteKind::kKvEvents: return "kv_events";
  }
  return "";
}

double load_limit(const std::vector<int>& in_flight, const std::vector<bool>& eligible, double max_imbalance) {
  double total = 0;
  int n = 0;
  for (size_t r = 0; r < in_flight.size(); ++r) {
    if (!eligible[r]) continue;
    total += in_flight[r];
    ++n;
  }
  const double mean = n > 0 ? total / n : 0;
  return (1.0 + max_imbalance) * mean + 1.0;
}

RouteChoice choose_affinity(const HashRing& ring, uint64_t key, const std::vector<int>& in_flight,
                            const std::vector<bool>& eligible, double max_imbalance) {
  const double limit = load_limit(in_flight, eligible, max_imbalance);
  bool first = true;
  for (int r : ring.walk(key)) {
    if (!eligible[static_cast<size_t>(r)]) continue;
    if (in_flight[static_cast<size_t>(r)] <= limit) return {r, first ? RouteKind::kAffinity : RouteKind::kFallback};
    first = false;
  }
  return {};
}

RouteChoice choose_least_loaded(const std::vector<int>& in_flight, const std::vector<bool>& eligible,
                                uint64_t tie_start) {
  RouteChoice best{-1, RouteKind::kLeastLoaded};
  const size_t n = in_flight.size();
  for (size_t i = 0; i < n; ++i) {
    const size_t r = (tie_start + i) % n;
    if (eligible[r] && (best.replica < 0 || in_flight[r] < in_flight[static_cast<size_t>(best.replica)]))
      best.replica = static_cast<int>(r);
  }
  return best;
}

RouteChoice choose_round_robin(const std::vector<bool>& eligible, uint64_t counter) {
  const size_t n = eligible.size();
  for (size_t i = 0; i < n; ++i) {
    const size_t r = (counter + i) % n;
    if (eligible[r]) return {static_cast<int>(r), RouteKind::kRoundRobin};
  }
  return {-1, RouteKind::kRoundRobin};
}

}  // namespace pagoda::router
