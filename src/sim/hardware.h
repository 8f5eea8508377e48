// Accelerator descriptions (data/hardware.json): memory, bandwidth, dense peak
// FLOP/s and the efficiencies the roofline cost model applies.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace pagoda::sim {

struct HardwareDesc {
  std::string name;
  uint64_t memory_bytes = 0;           // per device
  double mem_bandwidth = 0;            // bytes/s
  double peak_bf16_flops = 0;          // dense
  double peak_fp8_flops = 0;           // dense; 0 = no fp8 tensor cores
  uint64_t runtime_overhead_bytes = 0; // taken before any tensor (context, workspaces, graphs)
  double interconnect_bandwidth = 0;   // GPU-to-GPU bytes/s per direction; 0 = TP not modelled
  double interconnect_latency_s = 0;   // fixed cost of one all-reduce
  double compute_efficiency = 0.5;     // achieved / peak FLOP/s in the dense (linear-layer) math
  // achieved / peak FLOP/s in attention (QK^T, softmax, PV); JSON "attention",
  // which defaults to "compute" when absent
  double attention_efficiency = 0.5;
  double bandwidth_efficiency = 0.8;   // achieved / peak bytes/s
  double step_overhead_s = 0.002;      // fixed cost of one engine step
};

std::vector<std::string> list_hardware();
// Case-insensitive; a unique prefix ("h100") is accepted.
Expected<HardwareDesc> load_hardware(const std::string& name);

// A device of `memory_bytes` with no performance data (for --gpu-mem without --gpu).
HardwareDesc generic_device(uint64_t memory_bytes);

// Parses a byte count: "85899345920", "80GiB", "80GB" (10^9), "512MiB", "1.5e9".
Expected<uint64_t> parse_bytes(const std::string& s);
// "80.00 GiB", "512.0 MiB", "1280 B".
std::string format_bytes(double bytes);

}  // namespace pagoda::sim
