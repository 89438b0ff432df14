// time.h: deadlines for bounded waits, and wall-clock stamps.
//
// All deadline arithmetic saturates: a timeout too large to represent (up to
// INT64_MAX milliseconds, or an infinite number of seconds) means "no limit",
// never an overflowed point in the past that would expire at once.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>

namespace dyad {

using SteadyClock = std::chrono::steady_clock;

// a + b for non-negative millisecond counts, clamped to INT64_MAX.
constexpr int64_t SaturatingAddMs(int64_t a, int64_t b) {
  if (a < 0 || b < 0) return a < b ? a : b;  // callers' "no limit" (< 0) wins
  return a > std::numeric_limits<int64_t>::max() - b ? std::numeric_limits<int64_t>::max() : a + b;
}

// Seconds (fractional, may be huge or infinite) to whole milliseconds,
// rounded up and clamped to INT64_MAX; NaN and negatives give -1.
inline int64_t SecondsToMsSaturating(double s) {
  if (std::isnan(s) || s < 0) return -1;
  const double ms = std::ceil(s * 1000.0);
  // 2^63 is exactly representable; anything at or above it does not fit.
  if (ms >= 9223372036854775808.0) return std::numeric_limits<int64_t>::max();
  return static_cast<int64_t>(ms);
}

// A point in time after which a wait gives up. Never() waits without limit.
class Deadline {
 public:
  static Deadline Never() { return Deadline(SteadyClock::time_point::max()); }
  // `ms` from now; < 0, or too far to represent, means no limit.
  static Deadline AfterMs(int64_t ms) {
    if (ms < 0) return Never();
    const SteadyClock::time_point now = SteadyClock::now();
    // Headroom left before the clock's maximum, in whole milliseconds
    // (computed on the clock's own representation, which cannot overflow).
    const int64_t headroom =
        std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::time_point::max() - now)
            .count();
    if (ms >= headroom) return Never();
    return Deadline(now + std::chrono::milliseconds(ms));
  }
  bool never() const { return tp_ == SteadyClock::time_point::max(); }
  bool expired() const { return !never() && SteadyClock::now() >= tp_; }
  // Milliseconds left, clamped to [0, cap]; `cap` when there is no limit.
  int64_t RemainingMs(int64_t cap = INT32_MAX) const {
    if (never()) return cap;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(tp_ - SteadyClock::now()).count();
    if (left <= 0) return 0;
    return left < cap ? left : cap;
  }
  // The earlier of this deadline and `ms` from now.
  Deadline Min(int64_t ms) const {
    Deadline other = AfterMs(ms);
    return other.tp_ < tp_ ? other : *this;
  }
  SteadyClock::time_point time_point() const { return tp_; }

 private:
  explicit Deadline(SteadyClock::time_point tp) : tp_(tp) {}
  SteadyClock::time_point tp_;
};

// Nanoseconds since the Unix epoch (comparable across processes on a node).
inline uint64_t WallNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

inline uint64_t MonoNs() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(SteadyClock::now().time_since_epoch())
          .count());
}

}  // namespace dyad
