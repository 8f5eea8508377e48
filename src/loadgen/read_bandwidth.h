// The machine's memory read bandwidth and processor name, measured by `pagoda
// bench` itself so that decode can be reported as a fraction of what this
// machine delivers (instead of a figure assumed for one machine).
#pragma once
#include <cstddef>
#include <string>

namespace pagoda::loadgen {

// Best-of-`passes` streaming-read bandwidth in GB/s (1e9 bytes/s) of `threads`
// threads reading disjoint contiguous slices of one buffer of `bytes` (it
// should be far larger than the last-level cache; 1 GiB by default) with
// 64-byte loads (32-byte without AVX-512). The buffer is written once (so its
// pages exist) and freed before returning. A pass over 1 GiB takes ~20 ms, so
// many passes are cheap, and the best of them filters out co-tenants.
double measure_read_gbs(int threads, size_t bytes = size_t{1} << 30, int passes = 10);

// The processor's "model name" from /proc/cpuinfo ("unknown" if absent).
std::string cpu_model_name();

}  // namespace pagoda::loadgen
