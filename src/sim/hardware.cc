#include "sim/hardware.h"

#include <cctype>
#include <cmath>
#include <cstdlib>

#include "sim/json_util.h"
#include "sim/model_desc.h"

namespace pagoda::sim {

using detail::json;

std::vector<std::string> list_hardware() { return detail::list_entries("hardware.json", "hardware"); }

Expected<HardwareDesc> load_hardware(const std::string& name) {
  PAGODA_ASSIGN_OR_RETURN(detail::Entry e, detail::find_entry("hardware.json", "hardware", name, "hardware"));
  const std::string& key = e.key;
  const json& o = e.obj;
  const std::string ctx = "hardware.json " + key;
  HardwareDesc h;
  h.name = key;
  PAGODA_ASSIGN_OR_RETURN(int64_t mem, detail::get_required_int(o, "memory_bytes", ctx, 1));
  h.memory_bytes = static_cast<uint64_t>(mem);
  PAGODA_ASSIGN_OR_RETURN(h.mem_bandwidth, detail::get_number(o, "mem_bandwidth", 0, ctx));
  PAGODA_ASSIGN_OR_RETURN(h.peak_bf16_flops, detail::get_number(o, "peak_bf16_flops", 0, ctx));
  PAGODA_ASSIGN_OR_RETURN(h.peak_fp8_flops, detail::get_number(o, "peak_fp8_flops", 0, ctx));
  PAGODA_ASSIGN_OR_RETURN(int64_t rt, detail::get_int(o, "runtime_overhead_bytes", 1 << 30, ctx, 0));
  h.runtime_overhead_bytes = static_cast<uint64_t>(rt);
  PAGODA_ASSIGN_OR_RETURN(h.interconnect_bandwidth, detail::get_number(o, "interconnect_bandwidth", 0, ctx));
  PAGODA_ASSIGN_OR_RETURN(h.interconnect_latency_s, detail::get_number(o, "interconnect_latency_s", 0, ctx));
  if (h.interconnect_bandwidth < 0 || h.interconnect_latency_s < 0) {
    return errorf("%s: interconnect_bandwidth and interconnect_latency_s must be >= 0", ctx.c_str());
  }
  if (auto e = o.find("efficiency"); e != o.end() && e->is_object()) {
    PAGODA_ASSIGN_OR_RETURN(h.compute_efficiency, detail::get_number(*e, "compute", h.compute_efficiency, ctx));
    PAGODA_ASSIGN_OR_RETURN(h.attention_efficiency, detail::get_number(*e, "attention", h.compute_efficiency, ctx));
    PAGODA_ASSIGN_OR_RETURN(h.bandwidth_efficiency, detail::get_number(*e, "bandwidth", h.bandwidth_efficiency, ctx));
    PAGODA_ASSIGN_OR_RETURN(h.step_overhead_s, detail::get_number(*e, "step_overhead_s", h.step_overhead_s, ctx));
  }
  if (!(h.mem_bandwidth > 0) || !(h.peak_bf16_flops > 0) || h.peak_fp8_flops < 0) {
    return errorf("%s: mem_bandwidth and peak_bf16_flops must be positive, peak_fp8_flops >= 0", ctx.c_str());
  }
  if (!(h.compute_efficiency > 0 && h.compute_efficiency <= 1) ||
      !(h.attention_efficiency > 0 && h.attention_efficiency <= 1) ||
      !(h.bandwidth_efficiency > 0 && h.bandwidth_efficiency <= 1) || h.step_overhead_s < 0) {
    return errorf("%s: efficiencies must be in (0, 1] and step_overhead_s >= 0", ctx.c_str());
  }
  return h;
}

HardwareDesc generic_device(uint64_t memory_bytes) {
  HardwareDesc h;
  h.name = "custom (" + format_bytes(static_cast<double>(memory_bytes)) + ")";
  h.memory_bytes = memory_bytes;
  h.runtime_overhead_bytes = 1ull << 30;
  return h;
}

Expected<uint64_t> parse_bytes(const std::string& s) {
  const char* b = s.c_str();
  char* end = nullptr;
  const double v = std::strtod(b, &end);
  if (end == b || !(v >= 0) || !std::isfinite(v)) return errorf("'%s' is not a byte count", s.c_str());
  std::string suf(end);
  for (char& c : suf) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double mult = 1;
  if (suf.empty() || suf == "b") mult = 1;
  else if (suf == "k" || suf == "kb") mult = 1e3;
  else if (suf == "m" || suf == "mb") mult = 1e6;
  else if (suf == "g" || suf == "gb") mult = 1e9;
  else if (suf == "t" || suf == "tb") mult = 1e12;
  else if (suf == "kib") mult = 0x1p10;
  else if (suf == "mib") mult = 0x1p20;
  else if (suf == "gib") mult = 0x1p30;
  else if (suf == "tib") mult = 0x1p40;
  else return errorf("'%s': unknown unit '%s' (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)", s.c_str(), end);
  const double bytes = v * mult;
  if (bytes >= 9e18) return errorf("'%s' is too large", s.c_str());
  return static_cast<uint64_t>(std::llround(bytes));
}

std::string format_bytes(double bytes) {
  char buf[64];
  const double a = std::fabs(bytes);
  if (a >= 0x1p40) std::snprintf(buf, sizeof buf, "%.2f TiB", bytes / 0x1p40);
  else if (a >= 0x1p30) std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / 0x1p30);
  else if (a >= 0x1p20) std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / 0x1p20);
  else if (a >= 0x1p10) std::snprintf(buf, sizeof buf, "%.1f KiB", bytes / 0x1p10);
  else std::snprintf(buf, sizeof buf, "%.0f B", bytes);
  return buf;
}

}  // namespace pagoda::sim
