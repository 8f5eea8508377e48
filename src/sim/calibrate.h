// `pagoda sim --calibrate`: fit a device's efficiencies and per-step overhead
// to measured engine steps, on the simulator's own cost formula, so that
// simulate() reproduces what was measured.
//
// The cost of a step (sim/simulator.h step_cost) at efficiencies e_c (dense
// math), e_b (memory), e_a (attention math) and overhead c is
//   t = max(x / e_c, y / e_b) + z / e_a + c,   x = dense compute seconds at 100% of peak
//                                              y = memory seconds at 100% of bandwidth
//                                              z = attention seconds at 100% of peak
// x, y and z come from step_cost itself (called with every efficiency 1 and no
// overhead), so the fit uses exactly the formula the simulator uses. With
// a = 1/e_c, b = 1/e_b, d = 1/e_a the model is linear in (a, b, d, c) once each
// sample is labelled compute- or memory-bound; the label is a threshold on x / y,
// so trying every threshold over the samples sorted by x / y (n + 1 splits) and
// solving a weighted least-squares problem for each finds the best fit. d is
// told apart from a by decodes at several contexts (same x, z growing with the
// context).
// Residuals are relative ((predicted - measured) / measured), so a 10 ms decode
// step counts as much as a 2 s prefill. Efficiencies are capped at 1.
//
// The measurement itself runs the real engine and so lives in src/cli/
// (sim_calibrate.cc); this file is pure arithmetic and JSON.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "sim/planner.h"
#include "sim/simulator.h"

namespace pagoda::sim {

// One scheduled sequence of a step: `num_tokens` new tokens from `start_pos`.
struct SeqSlice {
  int32_t start_pos = 0;
  int32_t num_tokens = 0;
};

// The cost model's work of a step made of these slices (step_work on a StepPlan).
StepWork work_of(const PlanInput& p, const std::vector<SeqSlice>& seqs);

// One timed engine step (or the median of several identical ones).
struct CalibrationSample {
  std::string label;       // "prefill 256", "decode batch 16 ctx 64"
  StepWork work;
  double measured_s = 0;   // > 0
};

struct CalibrationFit {
  double compute_efficiency = 0;    // (0, 1]
  double attention_efficiency = 0;  // (0, 1]
  double bandwidth_efficiency = 0;  // (0, 1]
  double step_overhead_s = 0;       // >= 0
  bool compute_capped = false;      // the unconstrained fit wanted e_c > 1
  bool bandwidth_capped = false;    // the unconstrained fit wanted e_b > 1
  bool attention_capped = false;    // the unconstrained fit wanted e_a > 1
  // Per sample (same order), from step_cost with the fitted device:
  std::vector<double> predicted_s;
  std::vector<double> rel_error;    // (predicted - measured) / measured
  std::vector<bool> compute_bound;
  std::vector<double> attention_share;  // attention seconds / predicted seconds
  double rms_rel_error = 0;
  double max_abs_rel_error = 0;
};

// Fits p.hw's compute, attention and bandwidth efficiencies and step_overhead_s to
// the samples (p.hw's peak and bandwidth are kept). Needs at least 4 samples with
// positive times; errors say which is missing. When every sample is on one side
// of the roofline the other efficiency cannot be measured: it is kept from p.hw
// (if still consistent with the labels) and the fit says so through `note`.
Expected<CalibrationFit> fit_cost_model(const PlanInput& p, const std::vector<CalibrationSample>& samples,
                                        std::string* note = nullptr);

// p.hw with the fitted efficiencies and overhead.
HardwareDesc apply_fit(const HardwareDesc& hw, const CalibrationFit& fit);

// Rewrites the "efficiency" object of hardware entry `name` in the JSON text,
// leaving every other byte of the text as it was. The result is parsed back and
// checked. Errors: not JSON, no such entry.
Expected<std::string> set_efficiency_in_json(const std::string& json_text, const std::string& name,
                                             const CalibrationFit& fit);
// The same on a file (written through a temporary file and a rename).
Status write_efficiency(const std::string& path, const std::string& name, const CalibrationFit& fit);

// A table of the samples: label, tokens, measured, predicted, error, bound.
std::string format_fit(const PlanInput& p, const std::vector<CalibrationSample>& samples, const CalibrationFit& fit);

}  // namespace pagoda::sim
