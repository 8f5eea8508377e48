#include "http/process_memory.h"

#include <unistd.h>

#include <cstdio>

#include "base/log.h"
#include "base/timer.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace pagoda::server {

ProcessMemory process_memory() {
  ProcessMemory m;
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return m;
  unsigned long long size = 0, resident = 0, shared = 0;
  const int n = std::fscanf(f, "%llu %llu %llu", &size, &resident, &shared);
  std::fclose(f);
  if (n != 3) return m;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  m.virtual_size = static_cast<size_t>(size) * page;
  m.resident = static_cast<size_t>(resident) * page;
  // statm's third field counts file-backed and shared-memory resident pages.
  m.resident_anon = resident > shared ? static_cast<size_t>(resident - shared) * page : 0;
  return m;
}

std::string process_metrics_text() {
  const ProcessMemory m = process_memory();
  return "# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
         "# TYPE process_resident_memory_bytes gauge\n"
         "process_resident_memory_bytes " + std::to_string(m.resident) + "\n"
         "# HELP process_virtual_memory_bytes Virtual memory size in bytes.\n"
         "# TYPE process_virtual_memory_bytes gauge\n"
         "process_virtual_memory_bytes " + std::to_string(m.virtual_size) + "\n";
}

bool release_free_heap() {
#if defined(__GLIBC__)
  (void)::malloc_trim(0);
  return true;
#else
  return false;
#endif
}

size_t HeapReturn::before() const { return threshold_ == 0 ? 0 : process_memory().resident_anon; }

void HeapReturn::after(size_t before_bytes) {
  if (threshold_ == 0) return;
  const size_t now = process_memory().resident_anon;
  if (now <= before_bytes || now - before_bytes <= threshold_) return;
  Timer t;
  if (!release_free_heap()) return;
  trims_.fetch_add(1, std::memory_order_relaxed);
  PAGODA_LOG_DEBUG("heap: %.1f MiB more resident after a job; malloc_trim took %.2f ms, %.1f MiB resident now",
                   static_cast<double>(now - before_bytes) / (1 << 20), t.ms(),
                   static_cast<double>(process_memory().resident_anon) / (1 << 20));
}

}  // namespace pagoda::server
