// The one failure path of the libFuzzer targets: a broken invariant aborts with its name.
#pragma once
#include <cstdio>
#include <cstdlib>

namespace pagoda::fuzz {

inline void check(bool ok, const char* target, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "%s: %s\n", target, what);
    std::abort();
  }
}

}  // namespace pagoda::fuzz
