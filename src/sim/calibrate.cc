#include "sim/calibrate.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <sstream>

#include "sim/json_util.h"

namespace pagoda::sim {

StepWork work_of(const PlanInput& p, const std::vector<SeqSlice>& seqs) {
  sched::StepPlan plan;
  sched::RequestId id = 1;
  for (const SeqSlice& s : seqs) {
    sched::ScheduledSeq q;
    q.request_id = id++;
    q.start_pos = s.start_pos;
    q.token_ids.assign(static_cast<size_t>(std::max(0, s.num_tokens)), 1);
    q.wants_logits = true;
    plan.seqs.push_back(std::move(q));
  }
  return step_work(p, plan);
}

HardwareDesc apply_fit(const HardwareDesc& hw, const CalibrationFit& fit) {
  HardwareDesc h = hw;
  h.compute_efficiency = fit.compute_efficiency;
  h.attention_efficiency = fit.attention_efficiency;
  h.bandwidth_efficiency = fit.bandwidth_efficiency;
  h.step_overhead_s = fit.step_overhead_s;
  return h;
}

namespace {

// Parameters of t = max(a x, b y) + d z + c (a = 1 / e_c, b = 1 / e_b, d = 1 / e_a).
constexpr int kNumParams = 4;  // a, b, d, c
struct Params {
  double a = 1, b = 1, d = 1, c = 0;
  double* at(int j) { return j == 0 ? &a : j == 1 ? &b : j == 2 ? &d : &c; }
  double get(int j) const { return j == 0 ? a : j == 1 ? b : j == 2 ? d : c; }
};

struct Point {
  double x = 0, y = 0, z = 0, t = 0;  // dense compute s at peak, memory s at full bandwidth, attention s at peak, measured s
};

double predict(const Point& p, const Params& q) { return std::max(q.a * p.x, q.b * p.y) + q.d * p.z + q.c; }

double objective(const std::vector<Point>& pts, const Params& q) {
  double s = 0;
  for (const Point& p : pts) {
    const double r = predict(p, q) / p.t - 1.0;
    s += r * r;
  }
  return s;
}

using Fixed = std::array<bool, kNumParams>;

// Solves the weighted least-squares problem for the free parameters of
//   t_i = a x_i [compute_i] + b y_i [!compute_i] + d z_i + c
// with residuals relative to t_i; fixed parameters keep their value in *q.
// Returns false when the free parameters are not determined by the data.
bool solve(const std::vector<Point>& pts, const std::vector<bool>& compute, const Fixed& fixed, Params* q) {
  std::array<int, kNumParams> col{};
  int n = 0;
  for (int j = 0; j < kNumParams; ++j) col[static_cast<size_t>(j)] = fixed[static_cast<size_t>(j)] ? -1 : n++;
  if (n == 0) return true;
  double A[kNumParams][kNumParams] = {}, rhs[kNumParams] = {};
  for (size_t i = 0; i < pts.size(); ++i) {
    const Point& p = pts[i];
    // Row scaled by 1 / t: unknown part [x or 0, 0 or y, z, 1] / t = 1 - fixed part / t.
    const double full[kNumParams] = {compute[i] ? p.x : 0.0, compute[i] ? 0.0 : p.y, p.z, 1.0};
    double r = p.t;
    for (int j = 0; j < kNumParams; ++j)
      if (fixed[static_cast<size_t>(j)]) r -= full[j] * q->get(j);
    double row[kNumParams] = {};
    for (int j = 0; j < kNumParams; ++j)
      if (col[static_cast<size_t>(j)] >= 0) row[col[static_cast<size_t>(j)]] = full[j] / p.t;
    r /= p.t;
    for (int u = 0; u < n; ++u) {
      rhs[u] += row[u] * r;
      for (int v = 0; v < n; ++v) A[u][v] += row[u] * row[v];
    }
  }
  // Gaussian elimination with partial pivoting; a tiny pivot means a column of zeros.
  double scale = 0;
  for (int u = 0; u < n; ++u) scale = std::max(scale, A[u][u]);
  if (!(scale > 0)) return false;
  for (int k = 0; k < n; ++k) {
    int piv = k;
    for (int u = k + 1; u < n; ++u)
      if (std::fabs(A[u][k]) > std::fabs(A[piv][k])) piv = u;
    if (std::fabs(A[piv][k]) <= 1e-12 * scale) return false;
    if (piv != k) {
      for (int v = 0; v < n; ++v) std::swap(A[k][v], A[piv][v]);
      std::swap(rhs[k], rhs[piv]);
    }
    for (int u = k + 1; u < n; ++u) {
      const double f = A[u][k] / A[k][k];
      for (int v = k; v < n; ++v) A[u][v] -= f * A[k][v];
      rhs[u] -= f * rhs[k];
    }
  }
  double sol[kNumParams] = {};
  for (int k = n - 1; k >= 0; --k) {
    double s = rhs[k];
    for (int v = k + 1; v < n; ++v) s -= A[k][v] * sol[v];
    sol[k] = s / A[k][k];
  }
  for (int j = 0; j < kNumParams; ++j)
    if (col[static_cast<size_t>(j)] >= 0) *q->at(j) = sol[col[static_cast<size_t>(j)]];
  return true;
}

struct Candidate {
  Params q;
  double obj = std::numeric_limits<double>::infinity();
  bool a_capped = false, b_capped = false, d_capped = false;
  bool a_prior = false, b_prior = false, d_prior = false;
};

// The best feasible (a, b, d >= 1, c >= 0) solution for one labelling: a
// parameter that leaves the feasible set is pinned to its bound and the rest
// refit. When the attention term is not determined by the data (no sample
// attends over enough keys to tell it from the rest), d keeps the prior.
Candidate fit_labelling(const std::vector<Point>& pts, const std::vector<bool>& compute, const Params& prior,
                        bool keep_d) {
  Candidate cand;
  Fixed fixed{false, false, keep_d, false};
  cand.d_prior = keep_d;
  Params q = prior;
  q.c = 0;
  const bool any_c = std::find(compute.begin(), compute.end(), true) != compute.end();
  const bool any_m = std::find(compute.begin(), compute.end(), false) != compute.end();
  // A side with no sample cannot be measured: keep the prior.
  if (!any_c) fixed[0] = cand.a_prior = true;
  if (!any_m) fixed[1] = cand.b_prior = true;
  for (int iter = 0; iter < 2 * kNumParams; ++iter) {
    Params s = q;
    if (!solve(pts, compute, fixed, &s)) {
      if (fixed[2]) return cand;
      fixed[2] = cand.d_prior = true;  // retry with the attention efficiency from the prior
      continue;
    }
    bool changed = false;
    if (!fixed[3] && s.c < 0) {
      fixed[3] = changed = true;
      q.c = 0;
    }
    if (!fixed[0] && s.a < 1) {
      fixed[0] = changed = cand.a_capped = true;
      q.a = 1;
    }
    if (!fixed[1] && s.b < 1) {
      fixed[1] = changed = cand.b_capped = true;
      q.b = 1;
    }
    if (!fixed[2] && s.d < 1) {
      fixed[2] = changed = cand.d_capped = true;
      q.d = 1;
    }
    if (!changed) {
      q = s;
      cand.q = q;
      cand.obj = objective(pts, q);
      return cand;
    }
  }
  return cand;
}

std::vector<bool> labels_of(const std::vector<Point>& pts, const Params& q) {
  std::vector<bool> l(pts.size());
  for (size_t i = 0; i < pts.size(); ++i) l[i] = q.a * pts[i].x >= q.b * pts[i].y;
  return l;
}

// The best fit over every labelling (thresholds on x / y, then relabelling by the fit).
Candidate search(const std::vector<Point>& pts, const Params& prior, bool keep_d) {
  // Every threshold on x / y: samples [0, k) of the sorted order memory-bound, the rest compute-bound.
  std::vector<size_t> order(pts.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t i, size_t j) { return pts[i].x * pts[j].y < pts[j].x * pts[i].y; });
  // From all memory-bound down to all compute-bound; a later labelling must be better by
  // more than rounding, so that on exact data a side no sample needs keeps its prior
  // (a sample exactly on the ridge fits either way).
  Candidate best;
  for (size_t k = pts.size() + 1; k-- > 0;) {
    std::vector<bool> compute(pts.size(), false);
    for (size_t r = k; r < order.size(); ++r) compute[order[r]] = true;
    Candidate c = fit_labelling(pts, compute, prior, keep_d);
    if (c.obj < best.obj - 1e-24) best = c;
  }
  // Refine: relabel by the fitted roofline, refit, while the objective drops.
  for (int iter = 0; iter < 20 && std::isfinite(best.obj); ++iter) {
    Candidate c = fit_labelling(pts, labels_of(pts, best.q), prior, keep_d);
    if (!(c.obj < best.obj * (1 - 1e-12))) break;
    best = c;
  }
  return best;
}

}  // namespace

Expected<CalibrationFit> fit_cost_model(const PlanInput& p, const std::vector<CalibrationSample>& samples,
                                        std::string* note) {
  if (samples.size() < 4) return errorf("calibration needs at least 4 timed steps, got %zu", samples.size());
  PlanInput unit = p;
  unit.hw.compute_efficiency = 1.0;
  unit.hw.attention_efficiency = 1.0;
  unit.hw.bandwidth_efficiency = 1.0;
  unit.hw.step_overhead_s = 0.0;
  if (!(p.hw.peak_bf16_flops > 0) || !(p.hw.mem_bandwidth > 0)) {
    return errorf("device %s has no peak FLOP/s or bandwidth to calibrate against", p.hw.name.c_str());
  }
  std::vector<Point> pts;
  for (const CalibrationSample& s : samples) {
    if (!(s.measured_s > 0) || !std::isfinite(s.measured_s)) {
      return errorf("sample '%s': measured time %g s is not positive", s.label.c_str(), s.measured_s);
    }
    if (s.work.num_tokens <= 0) return errorf("sample '%s' computes no token", s.label.c_str());
    const StepCost c = step_cost(unit, s.work);
    pts.push_back({c.compute_s, c.memory_s, c.attention_s, s.measured_s});
  }
  Params prior;
  prior.a = 1.0 / p.hw.compute_efficiency;
  prior.b = 1.0 / p.hw.bandwidth_efficiency;
  prior.d = 1.0 / p.hw.attention_efficiency;

  // With the attention efficiency free and kept from the prior: the extra parameter
  // must pay for itself (Akaike's criterion on the relative residuals), else the
  // data do not tell attention apart from the rest (e.g. batch-1 decodes only,
  // where attention and KV reads both grow with the context alone).
  const Candidate free_d = search(pts, prior, false), kept_d = search(pts, prior, true);
  auto aic = [&](const Candidate& c, int k) {
    const double n = static_cast<double>(pts.size());
    return n * std::log(c.obj / n + 1e-12) + 2.0 * k;  // floor: rms residual 1e-6 counts as exact
  };
  Candidate best = kept_d;
  if (std::isfinite(free_d.obj) && (!std::isfinite(kept_d.obj) || aic(free_d, 4) < aic(kept_d, 3))) best = free_d;
  if (!std::isfinite(best.obj)) return errorf("the calibration fit found no solution for %zu samples", pts.size());
  // A side of the roofline no sample ends up on was not measured: its parameter only has to keep
  // every sample where it is. Keep the prior when it does, else take the bound nearest to it.
  {
    const std::vector<bool> lab = labels_of(pts, best.q);
    const bool any_c = std::find(lab.begin(), lab.end(), true) != lab.end();
    const bool any_m = std::find(lab.begin(), lab.end(), false) != lab.end();
    if (!any_m) {
      double b_max = std::numeric_limits<double>::infinity();  // b y <= a x for every sample
      for (const Point& q : pts) b_max = std::min(b_max, best.q.a * q.x / q.y * (1 - 1e-9));  // strictly inside
      best.q.b = std::max(1.0, std::min(prior.b, b_max));
      best.b_prior = true;
      best.b_capped = false;
    }
    if (!any_c) {
      double a_max = std::numeric_limits<double>::infinity();  // a x <= b y for every sample
      for (const Point& q : pts) a_max = std::min(a_max, best.q.b * q.y / q.x * (1 - 1e-9));
      best.q.a = std::max(1.0, std::min(prior.a, a_max));
      best.a_prior = true;
      best.a_capped = false;
    }
  }

  CalibrationFit fit;
  fit.compute_efficiency = 1.0 / best.q.a;
  fit.attention_efficiency = 1.0 / best.q.d;
  fit.bandwidth_efficiency = 1.0 / best.q.b;
  fit.step_overhead_s = best.q.c;
  fit.compute_capped = best.a_capped;
  fit.bandwidth_capped = best.b_capped;
  fit.attention_capped = best.d_capped;
  if (note) {
    note->clear();
    if (best.a_prior) {
      *note += "no step is compute-bound: the compute efficiency is not measured (" +
               std::string(best.q.a == prior.a ? "kept from hardware.json" : "set to the lowest value the steps allow") +
               "). ";
    }
    if (best.b_prior) {
      *note += "no step is memory-bound: the bandwidth efficiency is not measured (" +
               std::string(best.q.b == prior.b ? "kept from hardware.json" : "set to the lowest value the steps allow") +
               "). ";
    }
    if (best.d_prior) {
      *note += "the attention efficiency is kept from hardware.json: fitting it too did not pay for the extra "
               "parameter (the steps agree with it, or cannot tell attention from the rest: time decodes at "
               "several contexts). ";
    }
    if (best.d_capped) *note += "the fit wanted an attention efficiency above 1: capped at 1. ";
    if (best.a_capped) *note += "the fit wanted a compute efficiency above 1 (peak FLOP/s too low?): capped at 1. ";
    if (best.b_capped) *note += "the fit wanted a bandwidth efficiency above 1 (bandwidth too low?): capped at 1. ";
  }
  // Predictions through the simulator's own step_cost with the fitted device.
  PlanInput fitted = p;
  fitted.hw = apply_fit(p.hw, fit);
  double ss = 0;
  for (size_t i = 0; i < samples.size(); ++i) {
    const StepCost c = step_cost(fitted, samples[i].work);
    const double e = (c.total_s - samples[i].measured_s) / samples[i].measured_s;
    fit.predicted_s.push_back(c.total_s);
    fit.rel_error.push_back(e);
    fit.compute_bound.push_back(c.compute_s >= c.memory_s);
    fit.attention_share.push_back(c.attention_s / c.total_s);
    ss += e * e;
    fit.max_abs_rel_error = std::max(fit.max_abs_rel_error, std::fabs(e));
  }
  fit.rms_rel_error = std::sqrt(ss / static_cast<double>(samples.size()));
  return fit;
}

// ---- hardware.json surgery ----------------------------------------------------

namespace {

// A minimal JSON scanner over the original text: positions, not a tree, so the
// rest of the file keeps its layout, comments-as-fields and number spellings.
struct Scanner {
  const std::string& s;
  size_t skip_ws(size_t i) const {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) ++i;
    return i;
  }
  // s[i] == '"'; returns the index after the closing quote, the raw contents in *out.
  size_t string_end(size_t i, std::string* out) const {
    size_t j = i + 1;
    while (j < s.size() && s[j] != '"') j += s[j] == '\\' ? 2 : 1;
    if (out) *out = s.substr(i + 1, std::min(j, s.size()) - i - 1);
    return std::min(j + 1, s.size());
  }
  // The index after the value starting at i.
  size_t value_end(size_t i) const {
    if (i >= s.size()) return i;
    if (s[i] == '"') return string_end(i, nullptr);
    if (s[i] == '{' || s[i] == '[') {
      int depth = 0;
      for (size_t j = i; j < s.size(); ++j) {
        if (s[j] == '"') {
          j = string_end(j, nullptr) - 1;
        } else if (s[j] == '{' || s[j] == '[') {
          ++depth;
        } else if (s[j] == '}' || s[j] == ']') {
          if (--depth == 0) return j + 1;
        }
      }
      return s.size();
    }
    size_t j = i;
    while (j < s.size() && s[j] != ',' && s[j] != '}' && s[j] != ']' && s[j] != ' ' && s[j] != '\n') ++j;
    return j;
  }
  // Within the object starting at `obj` ('{'), the value span of member `key`.
  bool member(size_t obj, const std::string& key, size_t* vb, size_t* ve) const {
    size_t i = skip_ws(obj + 1);
    while (i < s.size() && s[i] == '"') {
      std::string k;
      i = skip_ws(string_end(i, &k));
      if (i >= s.size() || s[i] != ':') return false;
      const size_t b = skip_ws(i + 1);
      const size_t e = value_end(b);
      if (k == key) {
        *vb = b;
        *ve = e;
        return true;
      }
      i = skip_ws(e);
      if (i < s.size() && s[i] == ',') i = skip_ws(i + 1);
    }
    return false;
  }
};

std::string number(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.6g", v);
  return b;
}

}  // namespace

Expected<std::string> set_efficiency_in_json(const std::string& text, const std::string& name,
                                             const CalibrationFit& fit) {
  const nlohmann::json before = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (before.is_discarded() || !before.is_object()) return errorf("hardware.json: not a JSON object");
  if (!before.contains("hardware") || !before["hardware"].contains(name)) {
    return errorf("hardware.json has no entry \"%s\" under \"hardware\"", name.c_str());
  }
  const Scanner sc{text};
  const size_t root = sc.skip_ws(0);
  size_t hb = 0, he = 0, eb = 0, ee = 0;
  if (!sc.member(root, "hardware", &hb, &he) || text[hb] != '{' || !sc.member(hb, name, &eb, &ee) || text[eb] != '{') {
    return errorf("hardware.json: cannot locate entry \"%s\" in the text", name.c_str());
  }
  const std::string obj = "{\"compute\": " + number(fit.compute_efficiency) + ", \"attention\": " +
                          number(fit.attention_efficiency) + ", \"bandwidth\": " +
                          number(fit.bandwidth_efficiency) + ", \"step_overhead_s\": " + number(fit.step_overhead_s) +
                          "}";
  std::string out;
  size_t vb = 0, ve = 0;
  if (sc.member(eb, "efficiency", &vb, &ve)) {
    out = text.substr(0, vb) + obj + text.substr(ve);
  } else {
    // Append as the entry's last member, before its closing brace.
    size_t close = ee - 1;
    size_t last = close;
    while (last > eb && (text[last - 1] == ' ' || text[last - 1] == '\n' || text[last - 1] == '\t' ||
                         text[last - 1] == '\r'))
      --last;
    const bool empty = text[last - 1] == '{';
    out = text.substr(0, last) + (empty ? "" : ",") + " \"efficiency\": " + obj + text.substr(last);
  }
  // The edit must parse, change only this entry's efficiency, and read back the numbers written.
  nlohmann::json after = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
  if (after.is_discarded()) return errorf("hardware.json: the edited text does not parse (entry \"%s\")", name.c_str());
  nlohmann::json expect = before;
  expect["hardware"][name]["efficiency"] = after["hardware"][name]["efficiency"];
  const nlohmann::json& e = after["hardware"][name]["efficiency"];
  if (after != expect || !e.is_object() || !e.contains("compute") || !e.contains("attention") || !e.contains("bandwidth") ||
      !e.contains("step_overhead_s")) {
    return errorf("hardware.json: editing entry \"%s\" changed more than its efficiency", name.c_str());
  }
  return out;
}

Status write_efficiency(const std::string& path, const std::string& name, const CalibrationFit& fit) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return errorf("%s: cannot open", path.c_str());
  std::stringstream ss;
  ss << in.rdbuf();
  PAGODA_ASSIGN_OR_RETURN(std::string out, set_efficiency_in_json(ss.str(), name, fit));
  const std::string tmp = path + ".tmp";
  {
    std::ofstream o(tmp, std::ios::binary | std::ios::trunc);
    if (!o || !(o << out) || !o.flush()) return errorf("%s: cannot write", tmp.c_str());
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return errorf("cannot rename %s to %s: %s", tmp.c_str(), path.c_str(), ec.message().c_str());
  return Status::Ok();
}

std::string format_fit(const PlanInput& p, const std::vector<CalibrationSample>& samples, const CalibrationFit& fit) {
  std::string out;
  char b[256];
  std::snprintf(b, sizeof b, "%-26s %7s %12s %12s %8s  %-7s %s\n", "step", "tokens", "measured ms", "model ms", "error",
                "bound", "attn");
  out += b;
  for (size_t i = 0; i < samples.size() && i < fit.predicted_s.size(); ++i) {
    const double attn = i < fit.attention_share.size() ? fit.attention_share[i] : 0.0;
    std::snprintf(b, sizeof b, "%-26s %7lld %12.2f %12.2f %+7.1f%%  %-7s %3.0f%%\n", samples[i].label.c_str(),
                  static_cast<long long>(samples[i].work.num_tokens), samples[i].measured_s * 1e3,
                  fit.predicted_s[i] * 1e3, fit.rel_error[i] * 100, fit.compute_bound[i] ? "compute" : "memory",
                  attn * 100);
    out += b;
  }
  std::snprintf(b, sizeof b,
                "%s: compute efficiency %.4g (%.1f GFLOP/s of %.1f), attention efficiency %.4g (%.1f GFLOP/s), "
                "bandwidth efficiency %.4g (%.2f GB/s of %.2f), step overhead %.3f ms; rms error %.1f%%, max %.1f%%\n",
                p.hw.name.c_str(), fit.compute_efficiency, fit.compute_efficiency * p.hw.peak_bf16_flops / 1e9,
                p.hw.peak_bf16_flops / 1e9, fit.attention_efficiency,
                fit.attention_efficiency * p.hw.peak_bf16_flops / 1e9, fit.bandwidth_efficiency,
                fit.bandwidth_efficiency * p.hw.mem_bandwidth / 1e9, p.hw.mem_bandwidth / 1e9,
                fit.step_overhead_s * 1e3, fit.rms_rel_error * 100, fit.max_abs_rel_error * 100);
  out += b;
  return out;
}

}  // namespace pagoda::sim
