// thread_annotations.h: clang's thread-safety annotations and the mutex
// they check.
//
// A member a mutex protects is declared GUARDED_BY(mu_) (PT_GUARDED_BY for
// what a pointer member points to), a private helper that expects the
// caller to hold it REQUIRES(mu_), a function that must not be entered with
// it held EXCLUDES(mu_). clang -Wthread-safety then reports every access
// without the mutex (tests/tsa/run.sh runs it over src/ in the test suite).
// With GCC the macros expand to nothing.
//
// The analysis only knows locks taken through annotated types, so a class
// that annotates its members locks a dyad::Mutex through dyad::MutexLock
// (not std::lock_guard / std::unique_lock, which libstdc++ does not
// annotate). Condition variables stay std::condition_variable: MutexLock
// holds a std::unique_lock<std::mutex> on the Mutex's native mutex and
// waits on it (Wait / WaitUntil / WaitFor). A wait releases and retakes the
// mutex inside; to the analysis the lock is held throughout, which is true
// wherever the caller's code runs. A predicate lambda that reads guarded
// members says so: `lock.Wait(cv_, [&]() REQUIRES(mu_) { return done_; })`.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <type_traits>

#if defined(__clang__)
#define DYAD_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define DYAD_THREAD_ANNOTATION(x)
#endif

#define CAPABILITY(x) DYAD_THREAD_ANNOTATION(capability(x))
#define SCOPED_CAPABILITY DYAD_THREAD_ANNOTATION(scoped_lockable)
#define GUARDED_BY(x) DYAD_THREAD_ANNOTATION(guarded_by(x))
#define PT_GUARDED_BY(x) DYAD_THREAD_ANNOTATION(pt_guarded_by(x))
#define ACQUIRED_BEFORE(...) DYAD_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
#define ACQUIRED_AFTER(...) DYAD_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))
#define REQUIRES(...) DYAD_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define ACQUIRE(...) DYAD_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define RELEASE(...) DYAD_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) DYAD_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define EXCLUDES(...) DYAD_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define ASSERT_CAPABILITY(x) DYAD_THREAD_ANNOTATION(assert_capability(x))
#define RETURN_CAPABILITY(x) DYAD_THREAD_ANNOTATION(lock_returned(x))
#define NO_THREAD_SAFETY_ANALYSIS DYAD_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace dyad {

// A std::mutex the analysis can follow. Also BasicLockable, so
// std::condition_variable_any works with it, but prefer MutexLock's waits.
class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() ACQUIRE() { mu_.lock(); }
  void unlock() RELEASE() { mu_.unlock(); }
  bool try_lock() TRY_ACQUIRE(true) { return mu_.try_lock(); }
  // Tells the analysis the caller holds it (where it cannot see that, e.g.
  // in a callback run under the lock). Checks nothing at run time.
  void AssertHeld() const ASSERT_CAPABILITY(this) {}
  // The std::mutex underneath, for code that must hand it to the standard
  // library; the analysis does not follow locks taken on it.
  std::mutex& native_handle() { return mu_; }

 private:
  std::mutex mu_;
};

// Holds a Mutex for its scope; Unlock()/Lock() release and retake it inside
// the scope, and the waits below sleep on a std::condition_variable.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ACQUIRE(mu) : lk_(mu.native_handle()) {}
  ~MutexLock() RELEASE() {}
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Unlock() RELEASE() { lk_.unlock(); }
  void Lock() ACQUIRE() { lk_.lock(); }

  void Wait(std::condition_variable& cv) { cv.wait(lk_); }
  template <class Pred>
  void Wait(std::condition_variable& cv, Pred pred) {
    cv.wait(lk_, pred);
  }
  template <class Clock, class Dur>
  std::cv_status WaitUntil(std::condition_variable& cv,
                           const std::chrono::time_point<Clock, Dur>& deadline) {
    return cv.wait_until(lk_, deadline);
  }
  // False when the deadline passed with `pred` still false.
  template <class Clock, class Dur, class Pred>
  bool WaitUntil(std::condition_variable& cv, const std::chrono::time_point<Clock, Dur>& deadline,
                 Pred pred) {
    return cv.wait_until(lk_, deadline, pred);
  }
  template <class Rep, class Period>
  std::cv_status WaitFor(std::condition_variable& cv,
                         const std::chrono::duration<Rep, Period>& timeout) {
    return cv.wait_for(lk_, timeout);
  }
  template <class Rep, class Period, class Pred>
  bool WaitFor(std::condition_variable& cv, const std::chrono::duration<Rep, Period>& timeout,
               Pred pred) {
    return cv.wait_for(lk_, timeout, pred);
  }

 private:
  std::unique_lock<std::mutex> lk_;
};

// Releases a held Mutex for its scope and takes it back at the end (also
// when an exception leaves the scope): for a helper that REQUIRES the mutex
// and calls out without it, e.g. into a store or a user callback.
class SCOPED_CAPABILITY MutexUnlock {
 public:
  explicit MutexUnlock(Mutex& mu) RELEASE(mu) : mu_(mu) { mu_.unlock(); }
  ~MutexUnlock() RELEASE() { mu_.lock(); }
  MutexUnlock(const MutexUnlock&) = delete;
  MutexUnlock& operator=(const MutexUnlock&) = delete;

 private:
  Mutex& mu_;
};

// Runs f() with `mu` released and returns what it returns, with `mu` held
// again: `Result<T> r = WithoutLock(mu_, [&] { return store_->Get(k); });`.
template <class F>
std::invoke_result_t<F&> WithoutLock(Mutex& mu, F&& f) REQUIRES(mu) {
  MutexUnlock unlocked(mu);
  return f();
}

}  // namespace dyad
