// Flags shared by every command that builds an Engine (serve, bench workloads),
// spelled as vLLM and llama.cpp users know them. Each flag may also come from a
// PAGODA_* environment variable (PAGODA_KV_CACHE_MEMORY for --kv-cache-memory).
#pragma once
#include <string>
#include <vector>

#include "engine/engine.h"

namespace pagoda::cli {

// Simple argument cursor: --name VALUE, --name=VALUE and boolean --name.
class Args {
 public:
  Args(int argc, char** argv);
  // True if a boolean flag is present (or PAGODA_<NAME>=1/true).
  bool flag(const std::string& name, const std::string& alias = "");
  // Value of an option (or its PAGODA_* env var); empty if absent.
  bool value(const std::string& name, std::string* out, const std::string& alias = "");
  // Error text for anything not consumed; empty if all were used.
  std::string leftover() const;
  bool help() const { return help_; }

 private:
  std::vector<std::string> a_;
  std::vector<bool> used_;
  bool help_ = false;
};

// Parses a byte size: "123", "512MiB", "2GiB", "1.5GB" (GB = 1e9, GiB = 2^30).
bool parse_bytes(const std::string& s, int64_t* out);

// pagoda's KV dtype names (f32, f16, bf16, q8_0; base/kv_dtype.h) and vLLM's "auto" (f16 here).
bool parse_kv_dtype_name(const std::string& s, KvDtype* out);

// llama.cpp's -ctk / -ctv (each f16 unless given; nullptr = not given) as
// pagoda's single KV dtype. Returns "" or an error message: an unknown name,
// or K and V differing (pagoda keeps K and V in one dtype).
std::string kv_dtype_from_ctk_ctv(const std::string* k, const std::string* v, KvDtype* out);

// Reads the engine flags into cfg. Returns "" or an error message.
std::string parse_engine_flags(Args& args, engine::EngineConfig* cfg);
extern const char* kEngineFlagsHelp;

}  // namespace pagoda::cli
