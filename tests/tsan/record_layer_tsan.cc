// record_layer_tsan.cc: the record layer's threading contract under
// ThreadSanitizer (tests/tsan/run.sh builds and runs it; no gtest, so that
// only the record layer is compiled with -fsanitize=thread).
//
//  1. A session's two directions are used by two threads at once (one
//     seals while the other opens), each direction by one thread at a
//     time, over a queue, with rekeying every few records.
//  2. One direction handed from thread to thread between records (as a
//     connection moves between workers), under the lock of the hand-over.
//  3. Two threads inside one cipher at once are refused, without a data
//     race (the refused call never touches the cipher's state).
// Exit 0 when every check holds; any TSan report ends the run (exit 66).
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/seal.h"

namespace {

int g_failures = 0;
#define CHECK(cond)                                                                 \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++g_failures;                                                                 \
    }                                                                               \
  } while (0)

struct Record {
  std::string data;
  unsigned char tag[dyad::kSealTagSize];
};

std::unique_ptr<dyad::RecordCipher> Make(const unsigned char* key, bool sealing,
                                         dyad::SealLimits limits) {
  auto c = dyad::RecordCipher::Create(key, dyad::LinkProtection::kEncrypt, sealing, limits);
  CHECK(c.ok());
  return c.ok() ? std::move(*c) : nullptr;
}

void PipelineWithRekeying() {
  unsigned char k1[dyad::kSealKeySize], k2[dyad::kSealKeySize];
  for (size_t i = 0; i < dyad::kSealKeySize; ++i) {
    k1[i] = static_cast<unsigned char>(i);
    k2[i] = static_cast<unsigned char>(255 - i);
  }
  dyad::SealLimits limits;
  limits.records = 7;
  limits.bytes = 1 << 16;
  // Direction 1 (k1) and direction 2 (k2) of one session.
  auto seal1 = Make(k1, true, limits), open1 = Make(k1, false, limits);
  auto seal2 = Make(k2, true, limits), open2 = Make(k2, false, limits);
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Record> q1, q2;
  constexpr int kRecords = 400;
  auto producer = [&](dyad::RecordCipher* c, std::deque<Record>* q) {
    for (int i = 0; i < kRecords; ++i) {
      Record r;
      r.data = "record " + std::to_string(i) + std::string(static_cast<size_t>(i % 97), 'x');
      CHECK(c->Seal("hdr", r.data.data(), &r.data[0], r.data.size(), r.tag).ok());
      std::lock_guard<std::mutex> lk(mu);
      q->push_back(std::move(r));
      cv.notify_all();
    }
  };
  auto consumer = [&](dyad::RecordCipher* c, std::deque<Record>* q) {
    for (int i = 0; i < kRecords; ++i) {
      Record r;
      {
        std::unique_lock<std::mutex> lk(mu);
        cv.wait(lk, [&] { return !q->empty(); });
        r = std::move(q->front());
        q->pop_front();
      }
      CHECK(c->Open("hdr", &r.data[0], r.data.size(), r.tag).ok());
      CHECK(r.data.compare(0, 7, "record ") == 0);
    }
  };
  std::thread a(producer, seal1.get(), &q1), b(consumer, open1.get(), &q1);
  std::thread c(producer, seal2.get(), &q2), d(consumer, open2.get(), &q2);
  a.join();
  b.join();
  c.join();
  d.join();
  CHECK(seal1->epoch() == open1->epoch() && seal1->epoch() > 10);
  CHECK(seal2->epoch() == open2->epoch());
}

void HandOverBetweenThreads() {
  unsigned char key[dyad::kSealKeySize] = {9};
  auto sealer = Make(key, true, dyad::SealLimits{});
  auto opener = Make(key, false, dyad::SealLimits{});
  std::mutex mu;  // the hand-over (a worker pool's queue does the same)
  std::vector<Record> out;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 50; ++i) {
        std::lock_guard<std::mutex> lk(mu);
        Record r;
        r.data = "payload";
        CHECK(sealer->Seal("h", r.data.data(), &r.data[0], r.data.size(), r.tag).ok());
        out.push_back(std::move(r));
      }
    });
  for (auto& t : threads) t.join();
  for (Record& r : out) CHECK(opener->Open("h", &r.data[0], r.data.size(), r.tag).ok());
}

std::mutex g_hook_mu;
std::condition_variable g_hook_cv;
bool g_first_inside = false, g_release = false;
int g_hook_calls = 0;
void Hold() {
  std::unique_lock<std::mutex> lk(g_hook_mu);
  if (g_hook_calls++ != 0) return;
  g_first_inside = true;
  g_hook_cv.notify_all();
  g_hook_cv.wait(lk, [] { return g_release; });
}

void TwoThreadsAtOnceAreRefused() {
  unsigned char key[dyad::kSealKeySize] = {7};
  auto sealer = Make(key, true, dyad::SealLimits{});
  dyad::seal_testing::SetInsideHook(&Hold);
  std::string a(100, 'a'), b(100, 'b');
  unsigned char ta[dyad::kSealTagSize], tb[dyad::kSealTagSize];
  dyad::Status first;
  std::thread t([&] { first = sealer->Seal("x", a.data(), &a[0], a.size(), ta); });
  {
    std::unique_lock<std::mutex> lk(g_hook_mu);
    g_hook_cv.wait(lk, [] { return g_first_inside; });
  }
  dyad::Status second = sealer->Seal("x", b.data(), &b[0], b.size(), tb);
  {
    std::lock_guard<std::mutex> lk(g_hook_mu);
    g_release = true;
    g_hook_cv.notify_all();
  }
  t.join();
  dyad::seal_testing::SetInsideHook(nullptr);
  CHECK(second.code() == DYAD_RC_SYSFAIL);
  CHECK(first.code() == DYAD_RC_SYSFAIL);
}

}  // namespace

int main() {
  PipelineWithRekeying();
  HandOverBetweenThreads();
  TwoThreadsAtOnceAreRefused();
  if (g_failures != 0) {
    std::fprintf(stderr, "record layer (tsan): %d check(s) failed\n", g_failures);
    return 1;
  }
  std::printf(
      "record layer (tsan): sessions across threads, rekeying and the one-thread check: "
      "ok, no data race reported\n");
  return 0;
}
