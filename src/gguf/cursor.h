// The one reader of untrusted GGUF bytes. Every field (count, string length,
// array length, n_dims, dimension, offset) goes through a Cursor, which checks
// the bytes left BEFORE anything is read or reserved, with overflow-checked
// arithmetic (base/checked_math.h). Errors name the field, the offset and the
// numbers. Internal to gguf/.
#pragma once
#include <bit>
#include <cinttypes>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "base/checked_math.h"
#include "base/status.h"

namespace pagoda::gguf {

static_assert(std::endian::native == std::endian::little, "GGUF reader assumes a little-endian host");

class Cursor {
 public:
  Cursor(const uint8_t* base, uint64_t size) : base_(base), size_(size) {}

  uint64_t pos() const { return pos_; }
  uint64_t size() const { return size_; }
  uint64_t left() const { return size_ - pos_; }

  // n more bytes must be available for `field`.
  Status need(uint64_t n, std::string_view field) const {
    if (n <= left()) return Status::Ok();
    return errorf("%.*s at offset %" PRIu64 " needs %" PRIu64 " bytes but only %" PRIu64
                  " are left (file is %" PRIu64 " bytes)",
                  static_cast<int>(field.size()), field.data(), pos_, n, left(), size_);
  }

  // A little-endian scalar (T is a fixed-width integer or float).
  template <typename T>
  Status read(T* out, std::string_view field) {
    PAGODA_TRY(need(sizeof(T), field));
    std::memcpy(out, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return Status::Ok();
  }

  // A u64 count of items each taking at least min_item_bytes in the file: the
  // product must fit in the bytes left, so a claimed 2^63 items fails here,
  // before the caller reserves anything.
  Status read_count(uint64_t* out, uint64_t min_item_bytes, std::string_view field) {
    const uint64_t at = pos_;
    uint64_t n = 0;
    PAGODA_TRY(read(&n, field));
    uint64_t bytes = 0;
    if (!checked_mul(n, min_item_bytes, &bytes) || bytes > left()) {
      pos_ = at;
      return errorf("%.*s %" PRIu64 " at offset %" PRIu64 " needs at least %" PRIu64
                    " bytes per item but only %" PRIu64 " bytes are left (file is %" PRIu64 " bytes)",
                    static_cast<int>(field.size()), field.data(), n, at, min_item_bytes, left(), size_);
    }
    *out = n;
    return Status::Ok();
  }

  // A GGUF string: u64 length + bytes (not NUL-terminated).
  Status read_string(std::string_view* out, std::string_view field) {
    const uint64_t at = pos_;
    uint64_t len = 0;
    PAGODA_TRY(read(&len, field));
    if (len > left()) {
      pos_ = at;
      return errorf("%.*s length %" PRIu64 " at offset %" PRIu64 " runs past end of file (%" PRIu64
                    " bytes left, file is %" PRIu64 " bytes)",
                    static_cast<int>(field.size()), field.data(), len, at, left(), size_);
    }
    *out = std::string_view(reinterpret_cast<const char*>(base_ + pos_), static_cast<size_t>(len));
    pos_ += len;
    return Status::Ok();
  }
  Status read_string(std::string* out, std::string_view field) {
    std::string_view v;
    PAGODA_TRY(read_string(&v, field));
    out->assign(v.data(), v.size());
    return Status::Ok();
  }

 private:
  const uint8_t* base_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

}  // namespace pagoda::gguf
