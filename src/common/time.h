// time.h: deadlines for bounded waits, and wall-clock stamps.
#pragma once

#include <chrono>
#include <cstdint>

namespace dyad {

using SteadyClock = std::chrono::steady_clock;

// A point in time after which a wait gives up. Never() waits without limit.
class Deadline {
 public:
  static Deadline Never() { return Deadline(SteadyClock::time_point::max()); }
  static Deadline AfterMs(int64_t ms) {
    if (ms < 0) return Never();
    return Deadline(SteadyClock::now() + std::chrono::milliseconds(ms));
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
