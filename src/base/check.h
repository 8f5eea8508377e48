// CHECK: invariants that indicate a programming error (never user input).
#pragma once
#include <cstdio>
#include <cstdlib>

#define PAGODA_CHECK(cond)                                                       \
  do {                                                                           \
    if (!(cond)) {                                                               \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                              \
    }                                                                            \
  } while (0)

#define PAGODA_CHECK_MSG(cond, ...)                                             \
  do {                                                                          \
    if (!(cond)) {                                                              \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                        \
      std::fprintf(stderr, "\n");                                               \
      std::abort();                                                             \
    }                                                                           \
  } while (0)

#ifdef NDEBUG
#define PAGODA_DCHECK(cond) do { (void)sizeof(cond); } while (0)
#else
#define PAGODA_DCHECK(cond) PAGODA_CHECK(cond)
#endif
