// Errors are values: Expected<T> holds either a T or an Error with a message a
// user can act on. No exceptions cross module boundaries.
#pragma once
#include <string>
#include <utility>
#include <variant>
#include <cstdio>
#include <cstdlib>

namespace pagoda {

struct Error {
  std::string message;
};

inline Error make_error(std::string msg) { return Error{std::move(msg)}; }

// printf-style error construction: errorf("tensor %s: offset %llu ...", ...)
inline Error errorf(const char* msg) { return Error{msg}; }
template <typename... Args>
Error errorf(const char* fmt, Args... args) {
  int n = std::snprintf(nullptr, 0, fmt, args...);
  std::string s(n > 0 ? static_cast<size_t>(n) : 0, '\0');
  if (n > 0) std::snprintf(s.data(), s.size() + 1, fmt, args...);
  return Error{std::move(s)};
}

template <typename T>
class [[nodiscard]] Expected {
 public:
  Expected(T value) : v_(std::move(value)) {}           // NOLINT(implicit)
  Expected(Error error) : v_(std::move(error)) {}       // NOLINT(implicit)
  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() & { check_ok(); return std::get<0>(v_); }
  const T& value() const& { check_ok(); return std::get<0>(v_); }
  T&& value() && { check_ok(); return std::get<0>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  const Error& error() const { return std::get<1>(v_); }
  const std::string& message() const { return std::get<1>(v_).message; }

 private:
  void check_ok() const {
    if (!ok()) {
      std::fprintf(stderr, "pagoda: value() on error: %s\n", std::get<1>(v_).message.c_str());
      std::abort();
    }
  }
  std::variant<T, Error> v_;
};

// Status: Expected<void>.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error e) : err_(std::move(e.message)), failed_(true) {}  // NOLINT(implicit)
  static Status Ok() { return Status(); }
  bool ok() const { return !failed_; }
  explicit operator bool() const { return ok(); }
  const std::string& message() const { return err_; }
  Error error() const { return Error{err_}; }

 private:
  std::string err_;
  bool failed_ = false;
};

}  // namespace pagoda

// Propagate an error from an Expected/Status expression.
#define PAGODA_TRY(expr)                                  \
  do {                                                    \
    auto&& _pagoda_r = (expr);                            \
    if (!_pagoda_r.ok()) return _pagoda_r.error();        \
  } while (0)

#define PAGODA_CONCAT_INNER(a, b) a##b
#define PAGODA_CONCAT(a, b) PAGODA_CONCAT_INNER(a, b)
// PAGODA_ASSIGN_OR_RETURN(auto x, f());
#define PAGODA_ASSIGN_OR_RETURN(lhs, expr) \
  PAGODA_ASSIGN_OR_RETURN_IMPL(PAGODA_CONCAT(_pagoda_e, __LINE__), lhs, expr)
#define PAGODA_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.error();                 \
  lhs = std::move(tmp).value()
