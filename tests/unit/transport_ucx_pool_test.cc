// transport_ucx_pool_test.cc: the ucx transport's registered memory and
// buffer pools (src/transport/ucx/ucx_pool.h) on a real UCX worker: what a
// registered buffer carries, how a pool grows, bounds its waits, reuses
// buffers, and rests the buffer of a failed transfer. Transfers through the
// pools are tested by transport_conformance_test.
#ifdef DYAD_HAVE_UCX
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>

#include "transport/ucx/ucx_pool.h"
#include "transport/ucx/ucx_worker.h"

namespace dyad::ucx {
namespace {

constexpr size_t kMiB = 1u << 20;

class UcxPoolTest : public testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(worker_.Start().ok()); }
  Worker worker_;  // outlives every buffer of a test (declared first)
};

// A buffer is usable memory with the key a peer needs to reach it.
TEST_F(UcxPoolTest, RegisteredMemoryHasItsLengthAndAPackedKey) {
  Result<std::unique_ptr<RegisteredMemory>> anon = RegisteredMemory::MapAnonymous(worker_, kMiB);
  ASSERT_TRUE(anon.ok()) << anon.status().ToString();
  ASSERT_NE((*anon)->base(), nullptr);
  EXPECT_EQ((*anon)->length(), kMiB);
  EXPECT_FALSE((*anon)->packed_key().empty());
  EXPECT_FALSE((*anon)->ucx_allocated());
  std::memset((*anon)->base(), 0x5a, (*anon)->length());

  Result<std::unique_ptr<RegisteredMemory>> ucx = RegisteredMemory::Allocate(worker_, kMiB);
  ASSERT_TRUE(ucx.ok()) << ucx.status().ToString();
  ASSERT_NE((*ucx)->base(), nullptr);
  EXPECT_EQ((*ucx)->length(), kMiB);
  EXPECT_FALSE((*ucx)->packed_key().empty());
  EXPECT_TRUE((*ucx)->ucx_allocated());
  std::memset((*ucx)->base(), 0xa5, (*ucx)->length());
}

// Receive buffers come from UCX (shared memory a same-host owner can map)
// exactly when the context has shared memory; send buffers never do.
TEST_F(UcxPoolTest, ReceiveBuffersAreUcxAllocatedWhenTheContextHasSharedMemory) {
  BufferPool recv(worker_, BufferPool::Kind::kReceive, SlotBytes(256 * 1024), 1);
  BufferPool send(worker_, BufferPool::Kind::kSend, SlotBytes(256 * 1024), 1);
  Result<BufferLease> r = recv.Acquire(Deadline::AfterMs(1000), 0);
  Result<BufferLease> s = send.Acquire(Deadline::AfterMs(1000), 0);
  ASSERT_TRUE(r.ok() && s.ok());
  EXPECT_EQ(r->memory().ucx_allocated(), worker_.shm_capable());
  EXPECT_FALSE(s->memory().ucx_allocated());
  // A buffer holds kSlots slots of 2 x chunk_size / kSlots bytes.
  EXPECT_EQ(recv.slot_bytes(), 2 * 256 * 1024 / kSlots);
  EXPECT_EQ(r->memory().length(), recv.buffer_bytes());
  EXPECT_EQ(r->memory().length(), kSlots * recv.slot_bytes());
  r->MarkOk();
  s->MarkOk();
}

// Buffers are mapped on demand up to the pool's size, then a transfer waits
// (bounded) for one; a buffer given back after a good transfer is reused at
// once, and Preallocate maps one buffer only when none is mapped.
TEST_F(UcxPoolTest, MapsOnDemandUpToItsSizeThenWaitsBoundedAndReuses) {
  BufferPool pool(worker_, BufferPool::Kind::kSend, SlotBytes(64 * 1024), 2);
  EXPECT_TRUE(pool.Preallocate().ok());
  EXPECT_TRUE(pool.Preallocate().ok());
  EXPECT_EQ(pool.mapped(), 1u);
  Result<BufferLease> b = pool.Acquire(Deadline::AfterMs(1000), 60000);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(pool.mapped(), 1u);  // the preallocated buffer
  char* a_base = nullptr;
  {
    Result<BufferLease> a = pool.Acquire(Deadline::AfterMs(1000), 60000);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    EXPECT_EQ(pool.mapped(), 2u);
    EXPECT_NE(a->memory().base(), b->memory().base());
    Result<BufferLease> none = pool.Acquire(Deadline::AfterMs(100), 60000);
    ASSERT_FALSE(none.ok());
    EXPECT_EQ(none.status().code(), DYAD_RC_TIMEOUT);
    EXPECT_NE(none.status().message().find("DYAD_UCX_POOL_BUFFERS"), std::string::npos)
        << none.status().ToString();
    a_base = a->memory().base();
    a->MarkOk();
  }
  Result<BufferLease> again = pool.Acquire(Deadline::AfterMs(1000), 60000);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->memory().base(), a_base);
  EXPECT_EQ(pool.mapped(), 2u);
  again->MarkOk();
  b->MarkOk();
}

// The buffer of a failed transfer (no MarkOk) is not reused before its rest
// ends; meanwhile it does not count against the pool, so a later transfer
// gets a new buffer instead of waiting.
TEST_F(UcxPoolTest, BufferOfAFailedTransferRestsBeforeReuse) {
  constexpr int64_t kRestMs = 300;
  BufferPool pool(worker_, BufferPool::Kind::kSend, SlotBytes(64 * 1024), 1);
  char* failed_base = nullptr;
  {
    Result<BufferLease> failed = pool.Acquire(Deadline::AfterMs(1000), kRestMs);
    ASSERT_TRUE(failed.ok());
    failed_base = failed->memory().base();
  }
  Result<BufferLease> fresh = pool.Acquire(Deadline::AfterMs(1000), kRestMs);
  ASSERT_TRUE(fresh.ok());
  EXPECT_NE(fresh->memory().base(), failed_base);
  EXPECT_EQ(pool.mapped(), 2u);
  const auto t0 = std::chrono::steady_clock::now();
  Result<BufferLease> rested = pool.Acquire(Deadline::AfterMs(5000), kRestMs);
  const auto waited = std::chrono::steady_clock::now() - t0;
  ASSERT_TRUE(rested.ok()) << rested.status().ToString();
  EXPECT_EQ(rested->memory().base(), failed_base);
  EXPECT_GE(waited, std::chrono::milliseconds(kRestMs / 2));
  EXPECT_EQ(pool.mapped(), 2u);
  rested->MarkOk();
  fresh->MarkOk();
}

}  // namespace
}  // namespace dyad::ucx
#endif  // DYAD_HAVE_UCX
