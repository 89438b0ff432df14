// The annotated mutex (src/common/thread_annotations.h) at run time: the
// waits of MutexLock keep std::condition_variable working, Unlock/Lock and
// MutexUnlock really release the mutex, WithoutLock returns what it ran.
// (That the analysis itself rejects unguarded accesses is checked by the
// thread_safety_analysis test, tests/tsa/run.sh.)
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <thread>

#include "common/thread_annotations.h"

namespace dyad {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

struct Box {
  Mutex mu;
  std::condition_variable cv;
  int value GUARDED_BY(mu) = 0;

  void Set(int v) {
    MutexLock lk(mu);
    value = v;
    cv.notify_all();
  }
};

// Whether another thread could take `mu` right now (it lets go at once).
bool FreeForOthers(Mutex& mu) {
  bool got = false;
  std::thread([&] {
    if (mu.try_lock()) {
      mu.unlock();
      got = true;
    }
  }).join();
  return got;
}

TEST(ThreadAnnotations, WaitWithPredicateWakesOnNotify) {
  Box box;
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(20));
    box.Set(7);
  });
  MutexLock lk(box.mu);
  lk.Wait(box.cv, [&]() REQUIRES(box.mu) { return box.value == 7; });
  EXPECT_EQ(box.value, 7);
  lk.Unlock();
  setter.join();
}

TEST(ThreadAnnotations, WaitForAndWaitUntilTimeOutAndSucceed) {
  Box box;
  MutexLock lk(box.mu);
  const auto start = steady_clock::now();
  EXPECT_FALSE(lk.WaitFor(box.cv, milliseconds(30), [&]() REQUIRES(box.mu) { return box.value; }));
  EXPECT_GE(steady_clock::now() - start, milliseconds(30));
  EXPECT_EQ(lk.WaitUntil(box.cv, steady_clock::now() + milliseconds(5)), std::cv_status::timeout);
  lk.Unlock();
  std::thread setter([&] { box.Set(1); });
  lk.Lock();
  EXPECT_TRUE(lk.WaitUntil(box.cv, steady_clock::now() + std::chrono::seconds(10),
                           [&]() REQUIRES(box.mu) { return box.value == 1; }));
  lk.Unlock();
  setter.join();
}

TEST(ThreadAnnotations, UnlockAndMutexUnlockLetOthersIn) {
  Box box;
  MutexLock lk(box.mu);
  EXPECT_FALSE(FreeForOthers(box.mu));
  {
    MutexUnlock unlocked(box.mu);
    std::thread([&] { box.Set(5); }).join();  // would deadlock if still held
  }
  EXPECT_EQ(box.value, 5);
  EXPECT_FALSE(FreeForOthers(box.mu));  // held again
  lk.Unlock();
  std::thread([&] { box.Set(6); }).join();
  lk.Lock();
  EXPECT_EQ(box.value, 6);
}

TEST(ThreadAnnotations, WithoutLockReturnsWhatItRanWithTheLockReleased) {
  Box box;
  MutexLock lk(box.mu);
  const int seen = WithoutLock(box.mu, [&] { return FreeForOthers(box.mu) ? 42 : -1; });
  EXPECT_EQ(seen, 42);
  box.value = seen;
  EXPECT_FALSE(FreeForOthers(box.mu));  // held again
}

}  // namespace
}  // namespace dyad
