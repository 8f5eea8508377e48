#pragma once
#include <chrono>

namespace pagoda {

inline double now_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

class Timer {
 public:
  Timer() : t0_(now_seconds()) {}
  double seconds() const { return now_seconds() - t0_; }
  double ms() const { return seconds() * 1e3; }
  void reset() { t0_ = now_seconds(); }

 private:
  double t0_;
};

}  // namespace pagoda
