// sim/calibrate.h: the least-squares fit of efficiencies and step overhead on
// the simulator's own cost formula, and the in-place edit of hardware.json.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <tuple>

#include "sim/calibrate.h"

namespace pagoda::sim {
namespace {

PlanInput smol_on(double e_c, double e_b, double overhead, double e_a = 0.05) {
  PlanInput in;
  in.model = load_model_preset("SmolLM2-135M").value();
  in.hw = load_hardware("cpu-local").value();
  in.kv_dtype = kv::kv_dtype_f16();
  in.hw.compute_efficiency = e_c;
  in.hw.attention_efficiency = e_a;
  in.hw.bandwidth_efficiency = e_b;
  in.hw.step_overhead_s = overhead;
  return in;
}

// Prefills of one sequence and decode batches, as `pagoda sim --calibrate` measures them.
std::vector<CalibrationSample> synthetic(const PlanInput& truth, double noise) {
  std::vector<CalibrationSample> out;
  auto add = [&](const std::string& label, const std::vector<SeqSlice>& seqs) {
    CalibrationSample s;
    s.label = label;
    s.work = work_of(truth, seqs);
    const double k = static_cast<double>(out.size());
    s.measured_s = step_cost(truth, s.work).total_s * (1.0 + noise * std::sin(1.7 * k + 0.3));
    out.push_back(s);
  };
  for (int n : {32, 64, 128, 256, 512}) add("prefill " + std::to_string(n), {{0, n}});
  for (int b : {1, 2, 4, 8, 16, 32}) {
    for (int ctx : {64, 256}) add("decode " + std::to_string(b), std::vector<SeqSlice>(static_cast<size_t>(b), {ctx, 1}));
  }
  return out;
}

TEST(SimCalibrate, WorkOfMatchesStepWork) {
  const PlanInput in = smol_on(0.3, 0.6, 0.001);
  const StepWork w = work_of(in, {{0, 100}, {63, 1}});
  EXPECT_EQ(w.num_tokens, 101);
  EXPECT_DOUBLE_EQ(w.attended_keys, 100.0 * 101 / 2 + 64);
  // SmolLM2 f16: 30 layers x 3 KV heads x 64 x 2 (K, V) x 2 bytes = 23040 B per token.
  EXPECT_DOUBLE_EQ(w.kv_bytes_read, 23040.0 * (100 + 64));
  EXPECT_DOUBLE_EQ(w.kv_bytes_written, 23040.0 * 101);
}

TEST(SimCalibrate, RecoversKnownEfficienciesExactly) {
  const PlanInput truth = smol_on(0.23, 0.41, 0.0031, 0.07);
  const std::vector<CalibrationSample> s = synthetic(truth, 0.0);
  // Both sides of the roofline are present, or the test would not test the fit.
  int compute = 0;
  for (const auto& x : s) {
    const StepCost c = step_cost(truth, x.work);
    compute += c.compute_s >= c.memory_s;
  }
  ASSERT_GE(compute, 3);
  ASSERT_LE(compute, static_cast<int>(s.size()) - 3);
  // Start from other values: the fit must not lean on them.
  const PlanInput start = smol_on(0.5, 0.8, 0.0, 0.5);
  std::string note;
  auto fit = fit_cost_model(start, s, &note);
  ASSERT_TRUE(fit.ok()) << fit.message();
  EXPECT_NEAR(fit->compute_efficiency, 0.23, 1e-9);
  EXPECT_NEAR(fit->attention_efficiency, 0.07, 1e-9);
  EXPECT_NEAR(fit->bandwidth_efficiency, 0.41, 1e-9);
  EXPECT_NEAR(fit->step_overhead_s, 0.0031, 1e-12);
  EXPECT_LT(fit->max_abs_rel_error, 1e-9);
  EXPECT_FALSE(fit->compute_capped);
  EXPECT_FALSE(fit->bandwidth_capped);
  EXPECT_EQ(note, "");
  ASSERT_EQ(fit->predicted_s.size(), s.size());
  EXPECT_EQ(fit->compute_bound.size(), s.size());
  EXPECT_NE(format_fit(start, s, *fit).find("compute efficiency 0.23"), std::string::npos);
}

TEST(SimCalibrate, NoisyMeasurementsStayClose) {
  const PlanInput truth = smol_on(0.12, 0.55, 0.0008, 0.03);
  const std::vector<CalibrationSample> s = synthetic(truth, 0.04);
  auto fit = fit_cost_model(smol_on(0.3, 0.6, 0.0005, 0.3), s);
  ASSERT_TRUE(fit.ok()) << fit.message();
  EXPECT_NEAR(fit->compute_efficiency, 0.12, 0.12 * 0.06);
  EXPECT_NEAR(fit->attention_efficiency, 0.03, 0.03 * 0.15);
  EXPECT_NEAR(fit->bandwidth_efficiency, 0.55, 0.55 * 0.06);
  EXPECT_NEAR(fit->step_overhead_s, 0.0008, 0.0008);
  EXPECT_LT(fit->rms_rel_error, 0.04);
  EXPECT_GT(fit->rms_rel_error, 0.005);  // the noise shows in the residuals
}

TEST(SimCalibrate, OneSidedDataKeepsTheOtherEfficiency) {
  // Only batch-1 decodes: memory-bound everywhere, compute cannot be measured.
  const PlanInput truth = smol_on(0.2, 0.5, 0.002);
  std::vector<CalibrationSample> s;
  for (int ctx : {16, 128, 512, 1024, 2048}) {
    CalibrationSample x;
    x.label = "decode ctx " + std::to_string(ctx);
    x.work = work_of(truth, {{ctx, 1}});
    x.measured_s = step_cost(truth, x.work).total_s;
    s.push_back(x);
  }
  std::string note;
  auto fit = fit_cost_model(smol_on(0.3, 0.9, 0.0), s, &note);
  ASSERT_TRUE(fit.ok()) << fit.message();
  EXPECT_DOUBLE_EQ(fit->compute_efficiency, 0.3);
  // Attention and KV reads both grow with the context alone: attention keeps the prior.
  EXPECT_DOUBLE_EQ(fit->attention_efficiency, 0.05);
  EXPECT_NE(note.find("attention efficiency is kept"), std::string::npos) << note;
  EXPECT_NEAR(fit->bandwidth_efficiency, 0.5, 1e-9);
  EXPECT_NEAR(fit->step_overhead_s, 0.002, 1e-9);
  EXPECT_NE(note.find("no step is compute-bound"), std::string::npos) << note;
}

TEST(SimCalibrate, FasterThanPeakIsCappedAtOne) {
  // Steps twice as fast as the device's bandwidth allows: e_b would be 2.
  PlanInput truth = smol_on(0.2, 1.0, 0.0);
  std::vector<CalibrationSample> s = synthetic(truth, 0.0);
  PlanInput fast = truth;
  fast.hw.mem_bandwidth *= 2;
  for (CalibrationSample& x : s) x.measured_s = step_cost(fast, x.work).total_s;
  std::string note;
  auto fit = fit_cost_model(truth, s, &note);
  ASSERT_TRUE(fit.ok()) << fit.message();
  EXPECT_DOUBLE_EQ(fit->bandwidth_efficiency, 1.0);
  EXPECT_TRUE(fit->bandwidth_capped);
  EXPECT_LE(fit->compute_efficiency, 1.0);
  EXPECT_NE(note.find("capped at 1"), std::string::npos) << note;
}

TEST(SimCalibrate, RejectsTooFewOrBadSamples) {
  const PlanInput in = smol_on(0.3, 0.6, 0.001);
  std::vector<CalibrationSample> s = synthetic(in, 0.0);
  EXPECT_FALSE(fit_cost_model(in, {s[0], s[1], s[2]}).ok());
  s[2].measured_s = 0;
  auto bad = fit_cost_model(in, s);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find(s[2].label), std::string::npos) << bad.message();
}

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(SimCalibrate, EditsOnlyTheEntrysEfficiencyInHardwareJson) {
  const std::string text = read_all(std::string(PAGODA_SOURCE_DIR) + "/data/hardware.json");
  ASSERT_FALSE(text.empty());
  CalibrationFit fit;  // only what set_efficiency_in_json writes
  std::tie(fit.compute_efficiency, fit.attention_efficiency, fit.bandwidth_efficiency, fit.step_overhead_s) =
      std::make_tuple(0.125, 0.0625, 0.75, 0.0015);
  auto out = set_efficiency_in_json(text, "cpu-local", fit);
  ASSERT_TRUE(out.ok()) << out.message();
  // Exactly the entry's efficiency object changes; every other byte stays.
  const size_t entry = text.find("\"cpu-local\"");
  ASSERT_NE(entry, std::string::npos);
  const size_t key = text.find("\"efficiency\"", entry);
  ASSERT_NE(key, std::string::npos);
  const size_t ob = text.find('{', key), oe = text.find('}', key) + 1;
  const std::string expect = text.substr(0, ob) +
                             "{\"compute\": 0.125, \"attention\": 0.0625, \"bandwidth\": 0.75, \"step_overhead_s\": 0.0015}" +
                             text.substr(oe);
  EXPECT_EQ(*out, expect);

  // Written to a copy of the data directory, load_hardware reads the new numbers; others are unchanged.
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("pagoda_calib_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(std::string(PAGODA_SOURCE_DIR) + "/data/hardware.json", dir / "hardware.json");
  ASSERT_TRUE(write_efficiency((dir / "hardware.json").string(), "cpu-local", fit).ok());
  const HardwareDesc h100_before = load_hardware("H100-80GB-SXM").value();
  ASSERT_EQ(::setenv("PAGODA_DATA_DIR", dir.c_str(), 1), 0);
  const HardwareDesc cpu = load_hardware("cpu-local").value();
  const HardwareDesc h100 = load_hardware("H100-80GB-SXM").value();
  ::unsetenv("PAGODA_DATA_DIR");
  std::filesystem::remove_all(dir);
  EXPECT_DOUBLE_EQ(cpu.compute_efficiency, 0.125);
  EXPECT_DOUBLE_EQ(cpu.attention_efficiency, 0.0625);
  EXPECT_DOUBLE_EQ(cpu.bandwidth_efficiency, 0.75);
  EXPECT_DOUBLE_EQ(cpu.step_overhead_s, 0.0015);
  EXPECT_DOUBLE_EQ(h100.compute_efficiency, h100_before.compute_efficiency);
  EXPECT_DOUBLE_EQ(h100.step_overhead_s, h100_before.step_overhead_s);
}

TEST(SimCalibrate, AddsAMissingEfficiencyAndRejectsUnknownEntries) {
  const std::string text = R"({"hardware": {"a": {"mem_bandwidth": 1e9}, "b": {}}})";
  CalibrationFit fit;  // only what set_efficiency_in_json writes
  std::tie(fit.compute_efficiency, fit.attention_efficiency, fit.bandwidth_efficiency, fit.step_overhead_s) =
      std::make_tuple(0.5, 0.5, 0.25, 0.0);
  auto a = set_efficiency_in_json(text, "a", fit);
  ASSERT_TRUE(a.ok()) << a.message();
  EXPECT_EQ(*a, R"({"hardware": {"a": {"mem_bandwidth": 1e9, "efficiency": {"compute": 0.5, "attention": 0.5, "bandwidth": 0.25, "step_overhead_s": 0}}, "b": {}}})");
  auto b = set_efficiency_in_json(text, "b", fit);
  ASSERT_TRUE(b.ok()) << b.message();
  EXPECT_EQ(*b, R"({"hardware": {"a": {"mem_bandwidth": 1e9}, "b": { "efficiency": {"compute": 0.5, "attention": 0.5, "bandwidth": 0.25, "step_overhead_s": 0}}}})");
  EXPECT_FALSE(set_efficiency_in_json(text, "c", fit).ok());
  EXPECT_FALSE(set_efficiency_in_json("{not json", "a", fit).ok());
}

}  // namespace
}  // namespace pagoda::sim
