// Overflow-checked size arithmetic. Every count, length, offset and byte size
// read from an untrusted file goes through these.
#pragma once
#include <cstdint>

namespace pagoda {

// Returns false on overflow; *out is then unspecified.
inline bool checked_add(uint64_t a, uint64_t b, uint64_t* out) { return !__builtin_add_overflow(a, b, out); }
inline bool checked_mul(uint64_t a, uint64_t b, uint64_t* out) { return !__builtin_mul_overflow(a, b, out); }

// a + b <= limit, without overflow.
inline bool fits_within(uint64_t offset, uint64_t size, uint64_t limit) {
  uint64_t end;
  return checked_add(offset, size, &end) && end <= limit;
}

inline uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

}  // namespace pagoda
