// unguarded.cc: what tests/tsa/run.sh must see the analysis reject before
// it trusts a clean run (a misconfigured flag would otherwise pass every
// file silently). Each function below breaks one rule; run.sh expects one
// diagnostic per marked line. Never built into the project.
#include "common/thread_annotations.h"

namespace {

class Account {
 public:
  int ReadWithoutLock() { return balance_; }  // EXPECT: reading variable 'balance_'
  void WriteWithoutLock() { balance_ = 1; }   // EXPECT: writing variable 'balance_'
  void HelperWithoutLock() { AddLocked(1); }  // EXPECT: calling function 'AddLocked'
  void WriteWhileUnlocked() {
    dyad::MutexLock lk(mu_);
    {
      dyad::MutexUnlock unlocked(mu_);
      balance_ = 2;  // EXPECT: writing variable 'balance_'
    }
  }
  void Fine() {
    dyad::MutexLock lk(mu_);
    AddLocked(1);
    lk.Unlock();
    lk.Lock();
    balance_ += WithoutLock(mu_, [] { return 1; });
  }

 private:
  void AddLocked(int n) REQUIRES(mu_) { balance_ += n; }

  dyad::Mutex mu_;
  int balance_ GUARDED_BY(mu_) = 0;
};

}  // namespace

int UseAccount() {
  Account a;
  a.Fine();
  a.WriteWithoutLock();
  a.HelperWithoutLock();
  a.WriteWhileUnlocked();
  return a.ReadWithoutLock();
}
