// Helpers of the tier tests: a fresh temporary directory, entries made of
// recognisable bytes.
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "tier/entry.h"

namespace pagoda::tiertest {

// A new empty directory under $TMPDIR, removed with the object.
struct TempDir {
  std::string path;
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "pagoda-tier-XXXXXX").string();
    char* p = ::mkdtemp(tmpl.data());
    if (p == nullptr) ADD_FAILURE() << "mkdtemp failed";
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

inline tier::TierKey test_key(uint64_t chain_lo, std::string salt = "") {
  tier::TierKey k;
  k.model_fingerprint = 0x1234;
  k.kv_dtype = 1;
  k.block_size = 4;
  k.group = 0;
  k.cache_salt = std::move(salt);
  k.chain = Hash128{chain_lo, ~chain_lo};
  return k;
}

// `n` K/V bytes that depend on `seed` and the position.
inline std::string test_bytes(size_t n, uint8_t seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(seed * 31 + i * 7);
  return s;
}

}  // namespace pagoda::tiertest
