// DYAD_ASYNC_PUBLISH pipelined on the client (publish_pipeline.h) against a
// real in-process dyad-service: produce returns once its request is in the
// socket, failures are reported by the next produce and by dyad_finalize's
// flush, a client killed right after its produces returned loses none of
// them and publishes none twice, and a connection that breaks is reported
// with its unconfirmed publications, never replayed.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "client/client.h"
#include "client/publish_pipeline.h"
#include "common/fsutil.h"
#include "dyad/client/dyad_client.h"
#include "dyad/core/dyad_ctx.h"
#include "service/service.h"
#include "unit/service_pair.h"
#include "util.h"

namespace dyad {
namespace {

using testing_services::WriteFile;

class AsyncPublish : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = testutil::MakeTempDir("dyad-async-publish.");
    ASSERT_FALSE(base_.empty());
    prod_ = base_ + "/prod";
    sock_ = base_ + "/a.sock";
    ASSERT_EQ(::mkdir(prod_.c_str(), 0755), 0);
    StartService();
  }
  void StartService() {
    ServiceOptions o;
    o.rank = 0;
    o.prod_path = prod_;
    o.listen = "127.0.0.1:0";
    o.socket_path = sock_;
    o.kvs_url = "embedded";
    o.secret = testing_services::kTestSecret;
    o.rpc_timeout_ms = 5000;
    service_ = std::make_unique<Service>(o);
    Status st = service_->Start();
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  void TearDown() override {
    client_.reset();
    if (service_) service_->Stop();
    service_.reset();
    EXPECT_TRUE(testutil::RemoveTree(base_));
  }
  ClientConfig Config(bool async = true) {
    ClientConfig c;
    c.prod_managed_path = prod_;
    c.service_socket = sock_;
    c.rpc_timeout_ms = 5000;
    c.async_publish = async;
    c.kvs_namespace = "t";
    return c;
  }
  std::shared_ptr<Client> Make(const ClientConfig& c) {
    Result<std::shared_ptr<Client>> r = Client::Create(c);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : nullptr;
  }
  uint64_t Counter(const std::string& name) {
    auto c = Make(Config(false));
    Result<StatusReply> r = c->ServiceStatus();
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? r->counters[name] : 0;
  }
  // Stops the service and listens on its socket in its place: requests are
  // accepted (by the kernel) and never read or answered.
  Result<UniqueFd> SilentListener() {
    service_->Stop();
    service_.reset();
    ::unlink(sock_.c_str());
    Result<SocketAddress> addr = ParseAddress("unix:" + sock_);
    if (!addr.ok()) return addr.status();
    return Listen(*addr);
  }
  // The published records of namespace "t" under `prefix`.
  size_t Published(const std::string& prefix) {
    auto c = Make(Config(false));
    auto l = c->List(prefix, 0);
    EXPECT_TRUE(l.ok()) << l.status().ToString();
    return l.ok() ? l->size() : 0;
  }

  std::string base_, prod_, sock_;
  std::unique_ptr<Service> service_;
  std::shared_ptr<Client> client_;
};

TEST_F(AsyncPublish, ProduceReturnsBeforeTheReplyAndFlushConfirmsEveryOne) {
  client_ = Make(Config());
  ASSERT_EQ(::mkdir((prod_ + "/d").c_str(), 0755), 0);
  constexpr int kFiles = 200;
  for (int i = 0; i < kFiles; ++i) {
    const std::string f = prod_ + "/d/f" + std::to_string(i);
    WriteFile(f, "data " + std::to_string(i));
    Status st = client_->Produce(f);
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  // Pipelined: publications were sent without waiting for their replies.
  std::shared_ptr<PublishPipeline> pipeline = client_->pool()->PipelineIfAny();
  ASSERT_NE(pipeline, nullptr);
  Status st = client_->FlushPublications();
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(pipeline->outstanding(), 0u);
  EXPECT_EQ(Published("d/"), static_cast<size_t>(kFiles));
  EXPECT_EQ(Counter("requests.publish"), static_cast<uint64_t>(kFiles));
}

TEST_F(AsyncPublish, FailureIsReportedByTheNextProduceWhichDoesNotPublishItsFile) {
  ClientConfig c = Config();
  c.kvs_namespace = kMembersNamespace;  // the service refuses publications here
  client_ = Make(c);
  WriteFile(prod_ + "/a", "a");
  WriteFile(prod_ + "/b", "b");
  ASSERT_TRUE(client_->Produce(prod_ + "/a").ok());  // refused later, reported later
  // Once the service has answered, the next produce takes the reply.
  ASSERT_TRUE(testutil::Eventually([&] { return Counter("requests.publish") >= 1; }, 5000));
  ::usleep(100 * 1000);
  Status st = client_->Produce(prod_ + "/b");
  EXPECT_EQ(st.code(), DYAD_RC_PERM) << st.ToString();
  EXPECT_NE(st.message().find("asynchronous publish 'a' failed"), std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("'b' was not published"), std::string::npos) << st.message();
  // Reported once, and 'b' was not sent.
  EXPECT_TRUE(client_->FlushPublications().ok());
  EXPECT_EQ(Counter("requests.publish"), 1u);
}

TEST_F(AsyncPublish, FlushReportsTheEarliestFailureWithTheFileName) {
  ClientConfig c = Config();
  c.kvs_namespace = kMembersNamespace;
  client_ = Make(c);
  WriteFile(prod_ + "/x", "x");
  ASSERT_TRUE(client_->Produce(prod_ + "/x").ok());
  Status st = client_->FlushPublications();
  EXPECT_EQ(st.code(), DYAD_RC_PERM) << st.ToString();
  EXPECT_NE(st.message().find("asynchronous publish 'x' failed"), std::string::npos)
      << st.message();
  EXPECT_TRUE(client_->FlushPublications().ok());  // reported once
}

TEST_F(AsyncPublish, SynchronousPublishWaitsForQueuedAsynchronousOnes) {
  client_ = Make(Config());
  for (int i = 0; i < 50; ++i) {
    WriteFile(prod_ + "/q" + std::to_string(i), "v1");
    ASSERT_TRUE(client_->Produce(prod_ + "/q" + std::to_string(i)).ok());
  }
  // A client of the same pool without async: its publish flushes first.
  auto sync = Client::Create(Config(false), client_->pool());
  ASSERT_TRUE(sync.ok());
  WriteFile(prod_ + "/q0", "version two");
  ASSERT_TRUE((*sync)->Produce(prod_ + "/q0").ok());
  EXPECT_EQ(client_->pool()->PipelineIfAny()->outstanding(), 0u);
  Result<FileRecord> rec = [&] {
    ClientConfig c = Config(false);
    c.cons_managed_path = base_ + "/cons";
    auto r = Make(c);
    return r->GetMetadata(base_ + "/cons/q0", false);
  }();
  ASSERT_TRUE(rec.ok()) << rec.status().ToString();
  EXPECT_EQ(rec->size, std::string("version two").size());  // the later publication won
}

TEST_F(AsyncPublish, ConsumeAsksAfterQueuedAsynchronousPublications) {
  ClientConfig c = Config();
  c.cons_managed_path = prod_;  // this node's own files, one managed directory
  client_ = Make(c);
  for (int i = 0; i < 50; ++i) {
    WriteFile(prod_ + "/q" + std::to_string(i), "v1");
    ASSERT_TRUE(client_->Produce(prod_ + "/q" + std::to_string(i)).ok());
  }
  WriteFile(prod_ + "/q0", "version two");
  ASSERT_TRUE(client_->Produce(prod_ + "/q0").ok());
  ConsumeInfo info;
  Status st = client_->Consume(prod_ + "/q0", &info);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(client_->pool()->PipelineIfAny()->outstanding(), 0u);
  EXPECT_EQ(info.reply.record.size, std::string("version two").size());
  EXPECT_TRUE(client_->FlushPublications().ok());
}

// The client is killed (SIGKILL) right after its produces returned: every
// one of them is published, none twice.
TEST_F(AsyncPublish, ClientKilledAfterProducesLosesNoneAndPublishesNoneTwice) {
  constexpr int kFiles = 1000;
  ASSERT_EQ(::mkdir((prod_ + "/k").c_str(), 0755), 0);
  for (int i = 0; i < kFiles; ++i) WriteFile(prod_ + "/k/f" + std::to_string(i), "x");
  int pipefd[2];
  ASSERT_EQ(::pipe(pipefd), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(pipefd[0]);
    Result<std::shared_ptr<Client>> c = Client::Create(Config());
    int produced = 0;
    if (c.ok())
      for (int i = 0; i < kFiles; ++i)
        if ((*c)->Produce(prod_ + "/k/f" + std::to_string(i)).ok()) ++produced;
    (void)!::write(pipefd[1], &produced, sizeof produced);
    ::raise(SIGKILL);  // no flush, no close: the socket holds what was sent
    ::_exit(3);
  }
  ::close(pipefd[1]);
  int produced = -1;
  ASSERT_EQ(::read(pipefd[0], &produced, sizeof produced), static_cast<ssize_t>(sizeof produced));
  ::close(pipefd[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  ASSERT_EQ(produced, kFiles);
  EXPECT_TRUE(testutil::Eventually([&] { return Published("k/") == kFiles; }, 10000))
      << Published("k/") << " of " << kFiles << " published";
  EXPECT_TRUE(testutil::Eventually(
      [&] { return Counter("requests.publish") == static_cast<uint64_t>(kFiles); }, 5000));
  EXPECT_EQ(Counter("requests.publish"), static_cast<uint64_t>(kFiles))
      << "publications served: each exactly once";
}

// The connection breaks with publications unconfirmed: the next call says
// how many, and they are not sent again on the next connection.
TEST_F(AsyncPublish, BrokenConnectionReportsUnconfirmedAndDoesNotResend) {
  // In place of the service, a listener that takes requests and never
  // answers them.
  Result<UniqueFd> listener = SilentListener();
  ASSERT_TRUE(listener.ok()) << listener.status().ToString();
  client_ = Make(Config());
  ASSERT_NE(client_, nullptr);
  for (const char* f : {"u1", "u2", "u3"}) WriteFile(prod_ + "/" + f, f);
  ASSERT_TRUE(client_->Produce(prod_ + "/u1").ok());
  ASSERT_TRUE(client_->Produce(prod_ + "/u2").ok());
  auto take = [&] {
    Result<UniqueFd> fd = Accept(listener->get(), Deadline::AfterMs(5000));
    EXPECT_TRUE(fd.ok()) << fd.status().ToString();
    std::string got;
    if (!fd.ok()) return got;
    char buf[4096];
    ::usleep(50 * 1000);
    for (;;) {
      const ssize_t n = ::recv(fd->get(), buf, sizeof buf, MSG_DONTWAIT);
      if (n <= 0) break;
      got.append(buf, static_cast<size_t>(n));
    }
    return got;  // closed here: a hang-up with the requests unanswered
  };
  const std::string first = take();
  EXPECT_NE(first.find("u1"), std::string::npos);
  EXPECT_NE(first.find("u2"), std::string::npos);
  Status flushed = client_->FlushPublications();
  EXPECT_EQ(flushed.code(), DYAD_RC_CONNLOST) << flushed.ToString();
  EXPECT_NE(flushed.message().find("2 publications unconfirmed ('u1' to 'u2'"), std::string::npos)
      << flushed.message();
  EXPECT_NE(flushed.message().find("not sent again"), std::string::npos) << flushed.message();
  // The next publication goes on a new connection, alone.
  ASSERT_TRUE(client_->Produce(prod_ + "/u3").ok());
  const std::string second = take();
  EXPECT_NE(second.find("u3"), std::string::npos);
  EXPECT_EQ(second.find("u1"), std::string::npos) << "an unconfirmed publication was re-sent";
  EXPECT_EQ(second.find("u2"), std::string::npos) << "an unconfirmed publication was re-sent";
}

// A forked child does not write on its parent's pipeline connection: its
// publications go on a connection of its own, and the parent's stay
// confirmed by the parent.
TEST_F(AsyncPublish, ForkedChildUsesItsOwnConnection) {
  client_ = Make(Config());
  WriteFile(prod_ + "/p1", "p");
  WriteFile(prod_ + "/c1", "c");
  ASSERT_TRUE(client_->Produce(prod_ + "/p1").ok());
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The parent's pipeline is not this process's.
    std::shared_ptr<PublishPipeline> p = client_->pool()->PipelineIfAny();
    if (p != nullptr) ::_exit(2);
    Status st = client_->Produce(prod_ + "/c1");
    if (!st.ok()) ::_exit(3);
    ::_exit(client_->FlushPublications().ok() ? 0 : 4);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  Status st = client_->FlushPublications();
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(Published("p1"), 1u);
  EXPECT_EQ(Published("c1"), 1u);
  EXPECT_EQ(Counter("requests.publish"), 2u);
}

// dyad_finalize waits for the outstanding replies and returns a failure
// among them, naming the file.
TEST_F(AsyncPublish, DyadFinalizeReportsAFailedAsynchronousPublication) {
  ASSERT_EQ(::setenv("DYAD_SERVICE_SOCKET", sock_.c_str(), 1), 0);
  WriteFile(prod_ + "/fin", "x");
  ASSERT_EQ(
      dyad_init(false, false, false, true, /*async_publish=*/true, false, 3, 1024, 1,
                kMembersNamespace, prod_.c_str(), nullptr, false, nullptr, DYAD_COMM_SEND, nullptr),
      DYAD_RC_OK)
      << dyad_last_error();
  EXPECT_EQ(dyad_produce(dyad_ctx_get(), (prod_ + "/fin").c_str()), DYAD_RC_OK);
  EXPECT_EQ(dyad_finalize(), DYAD_RC_PERM);
  EXPECT_NE(std::string(dyad_last_error()).find("asynchronous publish 'fin' failed"),
            std::string::npos)
      << dyad_last_error();
  EXPECT_EQ(dyad_ctx_get(), nullptr);  // released all the same
  ::unsetenv("DYAD_SERVICE_SOCKET");
}

// A service that reads nothing: produce blocks once the socket buffer is
// full, at most the RPC timeout, and an interrupt ends the wait at once.
TEST_F(AsyncPublish, FullSocketBufferBlocksAtMostTheRpcTimeoutAndIsInterruptible) {
  Result<UniqueFd> listener = SilentListener();
  ASSERT_TRUE(listener.ok()) << listener.status().ToString();
  ClientConfig c = Config();
  c.rpc_timeout_ms = 300;
  client_ = Make(c);
  WriteFile(prod_ + "/full", "x");
  Status st;
  int sent = 0;
  for (; sent < 100000 && st.ok(); ++sent) {
    const auto t0 = std::chrono::steady_clock::now();
    st = client_->Produce(prod_ + "/full");
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
            .count();
    if (!st.ok()) {
      EXPECT_EQ(st.code(), DYAD_RC_TIMEOUT) << st.ToString();
      EXPECT_GE(ms, 250);
      EXPECT_LT(ms, 3000);
    }
  }
  ASSERT_FALSE(st.ok()) << "the socket buffer never filled";
  EXPECT_NE(st.message().find("not sent"), std::string::npos) << st.message();
  // (A timeout in the middle of a request drops the connection: the next
  // produce fills a new buffer first.)
  SetInterruptCheck([] { return true; });
  int64_t ms = 0;
  st = Status::OK();
  for (int i = 0; i < 100000 && st.ok(); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    st = client_->Produce(prod_ + "/full");
    ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
            .count();
  }
  SetInterruptCheck(nullptr);
  EXPECT_EQ(st.code(), DYAD_RC_CANCELLED) << st.ToString();
  EXPECT_LT(ms, 250);
}

// Threads of this process running as SCHED_BATCH (the service's loop while
// it serves asynchronous publications).
int BatchThreads() {
  int n = 0;
  DIR* d = ::opendir("/proc/self/task");
  if (d == nullptr) return -1;
  while (dirent* e = ::readdir(d)) {
    const int tid = std::atoi(e->d_name);
    if (tid > 0 && ::sched_getscheduler(tid) == SCHED_BATCH) ++n;
  }
  ::closedir(d);
  return n;
}

// While the loop serves a pipeline of asynchronous publications it runs as
// SCHED_BATCH (a producer's next request then does not preempt the
// producer); any other request, and a synchronous publish, turns it back.
TEST_F(AsyncPublish, LoopServesAsynchronousPublicationsWithoutPreemptingTheProducer) {
  ASSERT_EQ(BatchThreads(), 0);
  client_ = Make(Config());
  WriteFile(prod_ + "/s1", "1");
  ASSERT_TRUE(client_->Produce(prod_ + "/s1").ok());
  ASSERT_TRUE(client_->FlushPublications().ok());
  EXPECT_EQ(BatchThreads(), 1);
  auto sync = Make(Config(false));
  ASSERT_TRUE(sync->Ping().ok());
  EXPECT_EQ(BatchThreads(), 0);
  ASSERT_TRUE(client_->Produce(prod_ + "/s1").ok());
  ASSERT_TRUE(client_->FlushPublications().ok());
  EXPECT_EQ(BatchThreads(), 1);
  ASSERT_TRUE(sync->Produce(prod_ + "/s1").ok());
  EXPECT_EQ(BatchThreads(), 0);
}

}  // namespace
}  // namespace dyad
