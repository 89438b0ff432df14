// What only the Redis backend has (the shared contract is in
// kvs_conformance_test.cc): URL parsing, the key layout seen from Redis
// itself, database selection, password and ACL authentication, persistence
// across a restart of Redis, and waits that span a restart. Every test
// starts its own redis-server on a free loopback port in a temporary
// directory (tools/emu/redis_server.h) and skips when none is installed.
#include <gtest/gtest.h>

#ifdef DYAD_HAVE_REDIS
#include <hiredis/hiredis.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "emu/redis_server.h"
#include "kvs/kvs.h"
#include "kvs/redis/redis_kvs.h"
#include "proto/protocol.h"

namespace dyad {
namespace {

using emu::RedisServer;
using std::chrono::milliseconds;

int64_t MsSince(SteadyClock::time_point start) {
  return std::chrono::duration_cast<milliseconds>(SteadyClock::now() - start).count();
}

void SleepMs(int64_t ms) { std::this_thread::sleep_for(milliseconds(ms)); }

KvsOptions Options() {
  KvsOptions o;
  o.rpc_timeout_ms = 5000;
  return o;
}

// --- URL parsing (no server needed) ------------------------------------------

TEST(RedisUrl, HostPortDbAndCredentials) {
  Result<RedisConfig> c = ParseRedisUrl("redis://10.0.0.5:7000");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->nodes[0].host, "10.0.0.5");
  EXPECT_EQ(c->nodes[0].port, 7000);
  EXPECT_EQ(c->db, 0);
  EXPECT_EQ(c->password, "");

  c = ParseRedisUrl("redis://:s%40cret@db.example:6380/4?timeout_ms=1500&connect_timeout_ms=300");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->nodes[0].host, "db.example");
  EXPECT_EQ(c->nodes[0].port, 6380);
  EXPECT_EQ(c->db, 4);
  EXPECT_EQ(c->user, "");
  EXPECT_EQ(c->password, "s@cret");
  EXPECT_EQ(c->command_timeout_ms, 1500);
  EXPECT_TRUE(c->command_timeout_set);
  EXPECT_EQ(c->connect_timeout_ms, 300);

  c = ParseRedisUrl("redis://alice:pw@[::1]:6379/");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->user, "alice");
  EXPECT_EQ(c->password, "pw");
  EXPECT_EQ(c->nodes[0].host, "::1");

  c = ParseRedisUrl("redis://localhost");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->nodes[0].port, 6379);
}

TEST(RedisUrl, BadUrlsAreRefusedWithReasons) {
  for (const char* bad : {"redis://h:0", "redis://h:99999", "redis://h:x", "redis://h:1/db",
                          "redis://:6379", "redis://h:1?bogus=1", "redis://h:1?password_file=",
                          "redis://:%zz@h:1", "redis://h:1?prefix=a:b"}) {
    Result<RedisConfig> c = ParseRedisUrl(bad);
    EXPECT_EQ(c.status().code(), DYAD_RC_BADREQUEST) << bad << " " << c.status().ToString();
  }
  // A user needs a password from somewhere.
  if (::getenv("DYAD_REDIS_PASSWORD") == nullptr) {
    Result<std::unique_ptr<Kvs>> kvs = OpenKvs("redis://alice@h:1", Options());
    EXPECT_EQ(kvs.status().code(), DYAD_RC_BADREQUEST) << kvs.status().ToString();
  }
  Result<std::unique_ptr<Kvs>> kvs =
      OpenKvs("redis://h:1?password_file=/nonexistent/pw", Options());
  EXPECT_EQ(kvs.status().code(), DYAD_RC_AUTH) << kvs.status().ToString();
}

TEST(RedisUrl, TlsIsNotSupportedByThisHiredis) {
  for (const char* tls : {"rediss://h:6379", "redis://h:6379?tls=1"}) {
    Result<std::unique_ptr<Kvs>> kvs = OpenKvs(tls, Options());
    ASSERT_FALSE(kvs.ok()) << tls;
    EXPECT_EQ(kvs.status().code(), DYAD_RC_NOTSUP);
    EXPECT_NE(kvs.status().message().find("hiredis >= 1.0 with hiredis_ssl"), std::string::npos)
        << kvs.status().message();
  }
  std::vector<std::string> names = KvsBackendNames();
  EXPECT_NE(std::find(names.begin(), names.end(), "redis"), names.end());
}

// --- against a real server ---------------------------------------------------

// A raw hiredis connection, to look at what the backend wrote.
class RawRedis {
 public:
  RawRedis(int port, const std::string& password = "") {
    timeval tv{2, 0};
    c_ = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (c_ != nullptr && !password.empty()) Run({"AUTH", password});
  }
  ~RawRedis() {
    if (c_ != nullptr) redisFree(c_);
  }
  // The reply as text: strings as is, nil as "(nil)", integers in decimal,
  // errors prefixed "ERR:", arrays as their elements joined by ",".
  std::string Run(const std::vector<std::string>& argv) {
    if (c_ == nullptr || c_->err != 0) return "(no connection)";
    std::vector<const char*> a;
    std::vector<size_t> l;
    for (const std::string& s : argv) {
      a.push_back(s.data());
      l.push_back(s.size());
    }
    redisReply* r = static_cast<redisReply*>(
        redisCommandArgv(c_, static_cast<int>(a.size()), a.data(), l.data()));
    if (r == nullptr) return "(io error)";
    std::string out = Render(r);
    freeReplyObject(r);
    return out;
  }

 private:
  static std::string Render(const redisReply* r) {
    std::string out;
    if (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS) {
      out.assign(r->str, r->len);
    } else if (r->type == REDIS_REPLY_ERROR) {
      out = "ERR:" + std::string(r->str, r->len);
    } else if (r->type == REDIS_REPLY_NIL) {
      out = "(nil)";
    } else if (r->type == REDIS_REPLY_INTEGER) {
      out = std::to_string(r->integer);
    } else if (r->type == REDIS_REPLY_ARRAY) {
      for (size_t i = 0; i < r->elements; ++i) out += (i ? "," : "") + Render(r->element[i]);
    }
    return out;
  }

  redisContext* c_ = nullptr;
};

class RedisKvsTest : public ::testing::Test {
 protected:
  // Starts a server with `extra` config lines; false (and a skip) when no
  // redis-server is installed.
  bool StartServer(const std::string& extra = "") {
    server_ = std::make_unique<RedisServer>(extra);
    if (!server_->available()) return false;
    const std::string error = server_->Start();
    EXPECT_EQ(error, "");
    return error.empty();
  }
  std::unique_ptr<Kvs> Open(const std::string& url) {
    Result<std::unique_ptr<Kvs>> kvs = OpenKvs(url, Options());
    EXPECT_TRUE(kvs.ok()) << kvs.status().ToString();
    return kvs.ok() ? std::move(*kvs) : nullptr;
  }
  void TearDown() override { server_.reset(); }

  std::unique_ptr<RedisServer> server_;
};

#define START_OR_SKIP(extra)                                                            \
  do {                                                                                  \
    if (!StartServer(extra)) {                                                          \
      if (server_ && !server_->available())                                             \
        GTEST_SKIP() << "redis-server is not installed (apt-get install redis-server)"; \
      FAIL() << "could not start redis-server";                                         \
    }                                                                                   \
  } while (0)

TEST_F(RedisKvsTest, KeyLayoutIsPrefixHashTaggedNamespaceAndKey) {
  START_OR_SKIP("");
  std::unique_ptr<Kvs> kvs = Open(server_->url());
  ASSERT_NE(kvs, nullptr);
  const std::string binary("v\0\xff", 3);
  ASSERT_TRUE(kvs->Put(kMembersNamespace, "rank.3", binary).ok());
  ASSERT_TRUE(kvs->Put("t", "263.2ce.2e1.1/data0.txt", "rec").ok());
  RawRedis raw(server_->port());
  EXPECT_EQ(raw.Run({"GET", "dyad:{dyad.services}:rank.3"}), binary);
  EXPECT_EQ(raw.Run({"GET", "dyad:{t}:263.2ce.2e1.1/data0.txt"}), "rec");
  EXPECT_EQ(raw.Run({"DBSIZE"}), "2");
  // Braces in a namespace are encoded, so the hash tag stays unambiguous
  // and these two pairs cannot share a Redis key.
  ASSERT_TRUE(kvs->Put("a}:b", "c", "one").ok());
  ASSERT_TRUE(kvs->Put("a", "b}:c", "two").ok());
  EXPECT_EQ(raw.Run({"GET", "dyad:{a%7D:b}:c"}), "one");
  EXPECT_EQ(raw.Run({"GET", "dyad:{a}:b}:c"}), "two");
  Result<std::optional<std::string>> one = kvs->Get("a}:b", "c");
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(*one, std::optional<std::string>("one"));
  // A custom prefix keeps two deployments apart in one database.
  std::unique_ptr<Kvs> other = Open(server_->url() + "?prefix=exp2");
  ASSERT_NE(other, nullptr);
  ASSERT_TRUE(other->Put("t", "k", "x").ok());
  EXPECT_EQ(raw.Run({"GET", "exp2:{t}:k"}), "x");
  Result<std::optional<std::string>> miss = kvs->Get("t", "k");
  ASSERT_TRUE(miss.ok());
  EXPECT_EQ(*miss, std::nullopt);
}

TEST_F(RedisKvsTest, ListTreatsGlobCharactersLiterally) {
  START_OR_SKIP("");
  std::unique_ptr<Kvs> kvs = Open(server_->url());
  ASSERT_NE(kvs, nullptr);
  for (const char* k : {"a*b", "a*c", "axb", "a?", "[x]1", "x", "a\\q"}) {
    ASSERT_TRUE(kvs->Put("g*", k, k).ok());
  }
  ASSERT_TRUE(kvs->Put("gx", "a*z", "other namespace").ok());
  auto keys = [&](const std::string& ns, const std::string& prefix) {
    std::vector<std::string> out;
    Result<std::vector<KvsEntry>> l = kvs->List(ns, prefix);
    EXPECT_TRUE(l.ok()) << l.status().ToString();
    if (l.ok())
      for (const KvsEntry& e : *l) out.push_back(e.first);
    return out;
  };
  EXPECT_EQ(keys("g*", "a*"), (std::vector<std::string>{"a*b", "a*c"}));
  EXPECT_EQ(keys("g*", "a?"), (std::vector<std::string>{"a?"}));
  EXPECT_EQ(keys("g*", "[x]"), (std::vector<std::string>{"[x]1"}));
  EXPECT_EQ(keys("g*", "a\\"), (std::vector<std::string>{"a\\q"}));
  EXPECT_EQ(keys("g*", "").size(), 7u);
  EXPECT_EQ(keys("gx", ""), (std::vector<std::string>{"a*z"}));
  // More keys than one SCAN step returns, listed complete and sorted.
  for (int i = 0; i < 2500; ++i) ASSERT_TRUE(kvs->Put("many", std::to_string(i), "v").ok());
  Result<std::vector<KvsEntry>> all = kvs->List("many", "");
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 2500u);
  EXPECT_TRUE(std::is_sorted(all->begin(), all->end()));
  Result<std::vector<KvsEntry>> few = kvs->List("many", "1", 3);
  ASSERT_TRUE(few.ok());
  ASSERT_EQ(few->size(), 3u);
  EXPECT_EQ((*few)[0].first, "1");
  EXPECT_EQ((*few)[1].first, "10");
  EXPECT_EQ((*few)[2].first, "100");
}

TEST_F(RedisKvsTest, DatabaseIsSelected) {
  START_OR_SKIP("");
  std::unique_ptr<Kvs> kvs = Open(server_->url() + "/3");
  ASSERT_NE(kvs, nullptr);
  ASSERT_TRUE(kvs->Put("t", "k", "in three").ok());
  RawRedis raw(server_->port());
  EXPECT_EQ(raw.Run({"GET", "dyad:{t}:k"}), "(nil)");
  EXPECT_EQ(raw.Run({"SELECT", "3"}), "OK");
  EXPECT_EQ(raw.Run({"GET", "dyad:{t}:k"}), "in three");
}

TEST_F(RedisKvsTest, PasswordAuthentication) {
  START_OR_SKIP("requirepass hunter2\n");
  std::unique_ptr<Kvs> anonymous = Open(server_->url());
  ASSERT_NE(anonymous, nullptr);
  Status st = anonymous->Put("t", "k", "v");
  EXPECT_EQ(st.code(), DYAD_RC_AUTH) << st.ToString();
  std::unique_ptr<Kvs> wrong = Open(server_->url(":wrong@"));
  ASSERT_NE(wrong, nullptr);
  st = wrong->Put("t", "k", "v");
  EXPECT_EQ(st.code(), DYAD_RC_AUTH) << st.ToString();
  // An authentication failure is final: a wait reports it at once.
  const auto start = SteadyClock::now();
  Result<std::string> w = wrong->Wait("t", "k", Deadline::AfterMs(3000));
  EXPECT_EQ(w.status().code(), DYAD_RC_AUTH) << w.status().ToString();
  EXPECT_LT(MsSince(start), 1000);

  // From a file, the password stays out of the URL (and so out of logs).
  const std::string pw_file = server_->dir() + "/pw";
  std::ofstream(pw_file) << "hunter2\n";
  std::unique_ptr<Kvs> from_file = Open(server_->url() + "?password_file=" + pw_file);
  ASSERT_NE(from_file, nullptr);
  st = from_file->Put("t", "file", "ok");
  EXPECT_TRUE(st.ok()) << st.ToString();

  std::unique_ptr<Kvs> good = Open(server_->url(":hunter2@"));
  ASSERT_NE(good, nullptr);
  auto waiter =
      std::async(std::launch::async, [&] { return good->Wait("t", "k", Deadline::AfterMs(4000)); });
  SleepMs(100);
  st = good->Put("t", "k", "v");
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_EQ(waiter.wait_for(milliseconds(3000)), std::future_status::ready);
  Result<std::string> r = waiter.get();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, "v");
}

TEST_F(RedisKvsTest, AclUserLimitedToDyadKeys) {
  // alice may touch only keys under "dyad:" and channels under "dyad:", with
  // the command categories docs/redis.md recommends.
  START_OR_SKIP(
      "user alice on >alicepw ~dyad:* &dyad:* +@read +@write +@pubsub +@scripting "
      "+@keyspace +@connection\n");
  std::unique_ptr<Kvs> kvs = Open(server_->url("alice:alicepw@"));
  ASSERT_NE(kvs, nullptr);
  auto waiter = std::async(std::launch::async,
                           [&] { return kvs->Wait("t", "acl", Deadline::AfterMs(4000)); });
  SleepMs(100);
  Status st = kvs->Put("t", "acl", "allowed");
  ASSERT_TRUE(st.ok()) << st.ToString();
  Result<std::string> r = waiter.get();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, "allowed");
  Result<std::vector<KvsEntry>> l = kvs->List("t", "");
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->size(), 1u);
  // Outside its key pattern alice is refused: the prefix really is the fence.
  std::unique_ptr<Kvs> outside = Open(server_->url("alice:alicepw@") + "?prefix=other");
  ASSERT_NE(outside, nullptr);
  EXPECT_EQ(outside->Put("t", "k", "v").code(), DYAD_RC_AUTH);
  const std::string pw_file = server_->dir() + "/alice.pw";
  std::ofstream(pw_file) << "alicepw\n";
  std::unique_ptr<Kvs> by_file = Open(server_->url("alice@") + "?password_file=" + pw_file);
  ASSERT_NE(by_file, nullptr);
  Result<std::optional<std::string>> seen = by_file->Get("t", "acl");
  ASSERT_TRUE(seen.ok()) << seen.status().ToString();
  EXPECT_EQ(*seen, std::optional<std::string>("allowed"));
  std::unique_ptr<Kvs> bad = Open(server_->url("alice:nope@"));
  ASSERT_NE(bad, nullptr);
  EXPECT_EQ(bad->Put("t", "k", "v").code(), DYAD_RC_AUTH);
}

TEST_F(RedisKvsTest, PublishedDataSurvivesACrashOfPersistentRedis) {
  START_OR_SKIP("appendonly yes\nappendfsync always\n");
  std::unique_ptr<Kvs> kvs = Open(server_->url());
  ASSERT_NE(kvs, nullptr);
  ASSERT_TRUE(kvs->Put("t", "before", "durable").ok());
  server_->Kill();  // SIGKILL: no orderly shutdown
  ASSERT_EQ(server_->Start(), "");
  // The same client object: its pooled connections are dead and replaced.
  Result<std::optional<std::string>> r = kvs->Get("t", "before");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, std::optional<std::string>("durable"));
  ASSERT_TRUE(kvs->Put("t", "after", "also").ok());
  Result<std::string> w = kvs->Wait("t", "after", Deadline::AfterMs(1000));
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(*w, "also");
}

TEST_F(RedisKvsTest, WaitSpansRedisRestart) {
  START_OR_SKIP("");
  std::unique_ptr<Kvs> kvs = Open(server_->url());
  ASSERT_NE(kvs, nullptr);
  auto waiter = std::async(std::launch::async,
                           [&] { return kvs->Wait("t", "survivor", Deadline::AfterMs(8000)); });
  SleepMs(150);  // parked on the first server's subscription
  server_->Stop();
  SleepMs(300);  // the waiter sees the outage and backs off
  ASSERT_EQ(waiter.wait_for(milliseconds(0)), std::future_status::timeout);
  ASSERT_EQ(server_->Start(), "");
  // Put at once, while the waiter's subscriber is still backing off: no
  // message reaches it, and the re-check after it re-subscribes must find
  // the value.
  ASSERT_TRUE(kvs->Put("t", "survivor", "made it").ok());
  ASSERT_EQ(waiter.wait_for(milliseconds(3000)), std::future_status::ready);
  Result<std::string> r = waiter.get();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, "made it");

  // And a wait parked after the restart is woken by the message.
  auto second = std::async(std::launch::async,
                           [&] { return kvs->Wait("t", "second", Deadline::AfterMs(4000)); });
  SleepMs(200);
  const auto put_at = SteadyClock::now();
  ASSERT_TRUE(kvs->Put("t", "second", "pushed").ok());
  ASSERT_EQ(second.wait_for(milliseconds(3000)), std::future_status::ready);
  EXPECT_EQ(second.get().value(), "pushed");
  EXPECT_LT(MsSince(put_at), 500);  // the message, not the deadline
}

TEST_F(RedisKvsTest, WaitWhileRedisIsDownTimesOutWithReason) {
  START_OR_SKIP("");
  std::unique_ptr<Kvs> kvs = Open(server_->url() + "?connect_timeout_ms=200");
  ASSERT_NE(kvs, nullptr);
  server_->Stop();
  const auto start = SteadyClock::now();
  Result<std::string> r = kvs->Wait("t", "k", Deadline::AfterMs(600));
  const int64_t elapsed = MsSince(start);
  EXPECT_EQ(r.status().code(), DYAD_RC_TIMEOUT) << r.status().ToString();
  EXPECT_NE(r.status().message().find("unreachable"), std::string::npos) << r.status().message();
  EXPECT_GE(elapsed, 590);
  EXPECT_LT(elapsed, 2000);
  // A plain command fails after the connect retry window, not forever.
  const auto put_start = SteadyClock::now();
  Status st = kvs->Put("t", "k", "v");
  EXPECT_EQ(st.code(), DYAD_RC_CONNLOST) << st.ToString();
  EXPECT_LT(MsSince(put_start), 1500);
}

TEST_F(RedisKvsTest, ShutdownCancelsWaits) {
  START_OR_SKIP("");
  Result<std::unique_ptr<RedisKvs>> kvs = RedisKvs::Open(server_->url(), Options());
  ASSERT_TRUE(kvs.ok()) << kvs.status().ToString();
  RedisKvs* client = kvs->get();
  auto waiter = std::async(std::launch::async,
                           [&] { return client->Wait("t", "k", Deadline::AfterMs(8000)); });
  SleepMs(100);
  const auto start = SteadyClock::now();
  client->Shutdown();
  ASSERT_EQ(waiter.wait_for(milliseconds(2000)), std::future_status::ready);
  EXPECT_EQ(waiter.get().status().code(), DYAD_RC_CANCELLED);
  EXPECT_LT(MsSince(start), 600);
  EXPECT_TRUE(client->Put("t", "k", "v").ok());  // other calls keep working
}

TEST_F(RedisKvsTest, WaitUsesOneSubscriptionNotPolling) {
  START_OR_SKIP("");
  std::unique_ptr<Kvs> kvs = Open(server_->url());
  ASSERT_NE(kvs, nullptr);
  ASSERT_TRUE(kvs->Put("t", "warm", "x").ok());  // one pooled command link
  RawRedis raw(server_->port());
  const std::string before = raw.Run({"INFO", "commandstats"});
  auto waiter = std::async(std::launch::async,
                           [&] { return kvs->Wait("t", "quiet", Deadline::AfterMs(1500)); });
  SleepMs(1000);
  EXPECT_EQ(raw.Run({"PUBSUB", "NUMSUB", "dyad:{t}:quiet"}), "dyad:{t}:quiet,1");
  // While parked, the waiter sent GET at most twice (before and after
  // subscribing) in a whole second: no polling loop.
  auto get_calls = [](const std::string& info) -> long {
    const size_t at = info.find("cmdstat_get:calls=");
    if (at == std::string::npos) return 0;
    return std::stol(info.substr(at + 18));
  };
  const std::string during = raw.Run({"INFO", "commandstats"});
  EXPECT_LE(get_calls(during) - get_calls(before), 2) << during;
  EXPECT_EQ(waiter.get().status().code(), DYAD_RC_TIMEOUT);
}

TEST_F(RedisKvsTest, ManyWaitsShareOneSubscriberConnection) {
  START_OR_SKIP("");
  std::unique_ptr<Kvs> kvs = Open(server_->url());
  ASSERT_NE(kvs, nullptr);
  constexpr int kWaiters = 40;
  std::vector<std::future<Result<std::string>>> waiters;
  for (int i = 0; i < kWaiters; ++i) {
    waiters.push_back(std::async(std::launch::async, [&, i] {
      return kvs->Wait("t", "k" + std::to_string(i), Deadline::AfterMs(5000));
    }));
  }
  SleepMs(400);
  RawRedis raw(server_->port());
  // One pub/sub client for 40 waits on 40 keys.
  const std::string pubsub = raw.Run({"CLIENT", "LIST", "TYPE", "pubsub"});
  EXPECT_EQ(std::count(pubsub.begin(), pubsub.end(), '\n'), 1) << pubsub;
  EXPECT_EQ(raw.Run({"PUBSUB", "NUMSUB", "dyad:{t}:k7"}), "dyad:{t}:k7,1");
  for (int i = kWaiters - 1; i >= 0; --i) {
    ASSERT_TRUE(kvs->Put("t", "k" + std::to_string(i), "v" + std::to_string(i)).ok());
  }
  for (int i = 0; i < kWaiters; ++i) {
    ASSERT_EQ(waiters[i].wait_for(milliseconds(3000)), std::future_status::ready);
    Result<std::string> r = waiters[i].get();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(*r, "v" + std::to_string(i));
  }
  // Finished waits unsubscribe: no channel stays behind.
  std::string left;
  for (int i = 0; i < 50; ++i) {
    left = raw.Run({"PUBSUB", "CHANNELS", "dyad:*"});
    if (left.empty()) break;
    SleepMs(20);
  }
  EXPECT_EQ(left, "");
}

TEST_F(RedisKvsTest, WaitersComingAndGoingOnOneKey) {
  START_OR_SKIP("");
  std::unique_ptr<Kvs> kvs = Open(server_->url());
  ASSERT_NE(kvs, nullptr);
  // Short waits that time out, interleaved with long ones on the same key,
  // drive the channel through subscribe/unsubscribe/resubscribe; the long
  // waits must all still see the Put.
  std::vector<std::future<Result<std::string>>> shorts, longs;
  for (int round = 0; round < 5; ++round) {
    shorts.push_back(std::async(std::launch::async,
                                [&] { return kvs->Wait("t", "churn", Deadline::AfterMs(30)); }));
    SleepMs(40);
    longs.push_back(std::async(std::launch::async,
                               [&] { return kvs->Wait("t", "churn", Deadline::AfterMs(4000)); }));
  }
  for (auto& w : shorts) EXPECT_EQ(w.get().status().code(), DYAD_RC_TIMEOUT);
  ASSERT_TRUE(kvs->Put("t", "churn", "done").ok());
  for (auto& w : longs) {
    ASSERT_EQ(w.wait_for(milliseconds(3000)), std::future_status::ready);
    Result<std::string> r = w.get();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(*r, "done");
  }
}

}  // namespace
}  // namespace dyad

#else  // !DYAD_HAVE_REDIS

#include "kvs/kvs.h"

TEST(RedisKvs, NotCompiledInIsReportedClearly) {
  dyad::Result<std::unique_ptr<dyad::Kvs>> kvs =
      dyad::OpenKvs("redis://127.0.0.1:6379", dyad::KvsOptions());
  ASSERT_FALSE(kvs.ok());
  EXPECT_EQ(kvs.status().code(), DYAD_RC_NOTSUP);
  EXPECT_NE(kvs.status().message().find("not compiled in"), std::string::npos);
}

#endif  // DYAD_HAVE_REDIS
