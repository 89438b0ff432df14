// transport_ofi_test.cc: what the conformance suite cannot see of the "ofi"
// (libfabric) transport: its arguments carry endpoint names of any length,
// it says which provider it chose and why, separate endpoints pipeline many
// chunks through small slots, a restarted owner is a new peer, a failed
// RMA read is a clear error after which the next transfer works, peers
// with another provider or garbage arguments are refused with a message,
// and one registered buffer per pool serves concurrent transfers in turn.
//
// Runs over FI_PROVIDER=tcp (tcp;ofi_rxm) unless the environment chooses
// (tests/CMakeLists.txt runs it once more with FI_PROVIDER=shm).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/net.h"
#include "common/wire.h"
#include "transport/transport.h"

#ifdef DYAD_HAVE_OFI
#include "transport/ofi/ofi_transport.h"
#include "transport/ofi/ofi_wire.h"
#include "util.h"

namespace dyad {
namespace {

[[maybe_unused]] const bool g_env_set = [] {
  ::setenv("FI_PROVIDER", "tcp", /*overwrite=*/0);
  return true;
}();

constexpr uint64_t kMiB = 1u << 20;

std::string Provider() {
  const char* p = std::getenv("FI_PROVIDER");
  return p != nullptr ? p : "";
}

// Sets an environment variable for one scope (transports read theirs when
// constructed).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    if (old != nullptr) old_ = old;
    had_ = old != nullptr;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_) {
      ::setenv(name_, old_.c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

class TempDir : public testutil::TempDir {
 public:
  TempDir() : testutil::TempDir("dyad-ofi.", testing::TempDir()) {}
};

std::string Pattern(uint64_t size, uint64_t seed) {
  std::string s(static_cast<size_t>(size), '\0');
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (char& c : s) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    c = static_cast<char>(x);
  }
  return s;
}

using testutil::ReadAll;

struct Source {
  UniqueFd fd;
  FileSource src;
};

Source MakeSource(const std::string& path, const std::string& data) {
  UniqueFd w(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  EXPECT_TRUE(w.valid() && WriteFully(w.get(), data.data(), data.size()).ok());
  Source s;
  s.fd = UniqueFd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  s.src.fd = s.fd.get();
  s.src.size = data.size();
  s.src.path = path;
  return s;
}

struct Link {
  std::unique_ptr<Channel> owner, requester;
};

Link MakeLink() {
  int sv[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  return Link{std::make_unique<Channel>(UniqueFd(sv[0]), Trust::kAuthenticated),
              std::make_unique<Channel>(UniqueFd(sv[1]), Trust::kAuthenticated)};
}

std::unique_ptr<Transport> MakeOfi(size_t chunk_size = 4 * kMiB, int64_t idle_ms = 5000) {
  TransportOptions o;
  o.chunk_size = chunk_size;
  o.idle_ms = idle_ms;
  Result<std::unique_ptr<Transport>> t = CreateTransport("OFI", o);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(t).value() : nullptr;
}

struct Outcome {
  Status push, pull;
  TransferStats pushed, pulled;
};

// One transfer of `data` from `owner` to `requester` over a fresh link.
Outcome Transfer(Transport& owner, Transport& requester, const std::string& dir,
                 const std::string& name, const std::string& data) {
  Outcome out;
  Link link = MakeLink();
  Source s = MakeSource(dir + "/" + name, data);
  Result<std::string> req_args = requester.PrepareRequest();
  Result<std::string> reply_args = owner.ReplyArgs(s.src);
  EXPECT_TRUE(req_args.ok() && reply_args.ok());
  if (!req_args.ok() || !reply_args.ok()) return out;
  std::thread t([&] { out.push = owner.PushNow(*link.owner, s.src, *req_args, &out.pushed); });
  UniqueFd sink(
      ::open((dir + "/" + name + ".out").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  out.pull = requester.PullNow(*link.requester, data.size(), *reply_args, sink.get(), &out.pulled);
  t.join();
  return out;
}

OfiTransport& AsOfi(Transport& t) { return static_cast<OfiTransport&>(t); }

TEST(OfiWire, EndpointNamesOfAnyLengthRoundTrip) {
  for (size_t len : {size_t{1}, size_t{16}, size_t{127}, size_t{129}, size_t{200}, size_t{4096},
                     kOfiMaxAddressBytes}) {
    OfiReplyArgs a;
    a.provider = "cxi";
    a.host = "h";
    a.address = Pattern(len, len);
    a.instance = 42;
    a.slot_bytes = 1 << 20;
    a.slots = 4;
    OfiReplyArgs b;
    ASSERT_TRUE(b.Decode(a.Encode()).ok()) << len;
    EXPECT_EQ(b.address, a.address);
    EXPECT_EQ(b.instance, 42u);
  }
  OfiReplyArgs big;
  big.provider = "x";
  big.address = std::string(kOfiMaxAddressBytes + 1, 'a');
  big.slot_bytes = 4096;
  big.slots = 1;
  OfiReplyArgs out;
  EXPECT_EQ(out.Decode(big.Encode()).code(), DYAD_RC_BADUNPACK);
  const std::string good = OfiRequestArgs{"tcp;ofi_rxm", "h", 4096, 4}.Encode();
  OfiRequestArgs r;
  for (size_t cut = 0; cut < good.size(); ++cut)
    EXPECT_EQ(r.Decode(good.substr(0, cut)).code(), DYAD_RC_BADUNPACK) << cut;
  EXPECT_EQ(r.Decode(OfiRequestArgs{"tcp", "h", 4096, 0}.Encode()).code(), DYAD_RC_BADUNPACK);
  EXPECT_EQ(r.Decode(OfiRequestArgs{"tcp", "h", 0, 4}.Encode()).code(), DYAD_RC_BADUNPACK);
}

TEST(OfiWire, GeometryTakesTheSmallerSideAndCountsChunks) {
  Result<OfiGeometry> g = OfiGeometryFor(10 * kMiB + 1, 2 * kMiB, 4, kMiB, 8);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->chunk, kMiB);
  EXPECT_EQ(g->window, 4u);
  EXPECT_EQ(g->chunks, 11u);
  EXPECT_FALSE(OfiGeometryFor(1, 0, 4, kMiB, 4).ok());
}

TEST(OfiTransport, DescribesTheProviderItChoseAndRegistersMemory) {
  std::unique_ptr<Transport> t = MakeOfi();
  ASSERT_TRUE(t);
  EXPECT_EQ(t->name(), "ofi");
  EXPECT_TRUE(t->caps().rma_get);
  EXPECT_TRUE(t->caps().needs_registration);
  EXPECT_EQ(t->Details(), "not started");
  const std::string probe = t->Probe();
  EXPECT_NE(probe.find("provider " + Provider()), std::string::npos) << probe;
  ASSERT_TRUE(t->Warm().ok());
  const std::string d = t->Details();
  for (const char* want : {"FI_PROVIDER=", "RMA read yes", "MR mode", "inject", "max message",
                           "completions", "1 receive", "1 send"})
    EXPECT_NE(d.find(want), std::string::npos) << want << " in: " << d;
  std::vector<char> mem(1 << 16);
  Result<std::unique_ptr<OfiRegion>> r = AsOfi(*t).Register(mem.data(), mem.size());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)->addr(), mem.data());
  EXPECT_EQ((*r)->PackedKey().size(), 16u);
  EXPECT_EQ(AsOfi(*t).Register(nullptr, 0).status().code(), DYAD_RC_BADBUF);
  t.reset();  // the region outlives the transport object
  r->reset();
}

TEST(OfiTransport, SeparateEndpointsPipelineManyChunksThroughSmallSlots) {
  TempDir dir;
  // 64 KiB chunks: 32 KiB slots, four in flight, 161 reads.
  std::unique_ptr<Transport> owner = MakeOfi(64 * 1024);
  std::unique_ptr<Transport> requester = MakeOfi(64 * 1024);
  ASSERT_TRUE(owner && requester);
  const std::string data = Pattern(5 * kMiB + 3, 1);
  for (int round = 0; round < 2; ++round) {
    Outcome o = Transfer(*owner, *requester, dir.path(), "f" + std::to_string(round), data);
    ASSERT_TRUE(o.push.ok()) << o.push.ToString();
    ASSERT_TRUE(o.pull.ok()) << o.pull.ToString();
    EXPECT_EQ(o.pulled.chunks, 161u);
    EXPECT_EQ(o.pulled.bytes, data.size());
    EXPECT_TRUE(ReadAll(dir.path() + "/f" + std::to_string(round) + ".out") == data);
  }
  // Both transfers used one address-vector entry for the owner.
  EXPECT_NE(requester->Details().find("peers cached 1"), std::string::npos) << requester->Details();
}

TEST(OfiTransport, RestartedOwnerIsANewPeer) {
  TempDir dir;
  std::unique_ptr<Transport> requester = MakeOfi();
  const std::string data = Pattern(3 * kMiB + 5, 2);
  for (int incarnation = 0; incarnation < 3; ++incarnation) {
    std::unique_ptr<Transport> owner = MakeOfi();
    Outcome o = Transfer(*owner, *requester, dir.path(), "r" + std::to_string(incarnation), data);
    ASSERT_TRUE(o.push.ok() && o.pull.ok()) << o.push.ToString() << " / " << o.pull.ToString();
    EXPECT_TRUE(ReadAll(dir.path() + "/r" + std::to_string(incarnation) + ".out") == data);
  }
}

// An owner that announces a chunk its memory does not hold: the read
// fails, the requester says so with a code and which chunk, and tells the
// owner; the next transfer between the two works.
TEST(OfiTransport, FailedReadIsAClearErrorAndTheNextTransferWorks) {
  TempDir dir;
  std::unique_ptr<Transport> owner = MakeOfi();
  std::unique_ptr<Transport> requester = MakeOfi(4 * kMiB, 2000);
  std::vector<char> mem(1 << 20);
  Result<std::unique_ptr<OfiRegion>> region = AsOfi(*owner).Register(mem.data(), mem.size());
  ASSERT_TRUE(region.ok()) << region.status().ToString();
  const std::string packed = (*region)->PackedKey();  // the Decoder views it
  Decoder key(packed);
  const uint64_t base = key.U64();
  const uint64_t rkey = key.U64();
  Source s = MakeSource(dir.path() + "/bad", Pattern(kMiB, 3));
  Result<std::string> reply_args = owner->ReplyArgs(s.src);
  ASSERT_TRUE(reply_args.ok());
  Link link = MakeLink();
  Status owner_saw;
  std::thread fake_owner([&] {
    uint16_t type = 0;
    std::string payload;
    owner_saw = link.owner->RecvFrame(&type, &payload, Deadline::AfterMs(5000));  // kReady
    OfiChunk c;
    c.length = kMiB;                             // the whole file is chunk 0 (2 MiB slots)
    c.remote_addr = base + (uint64_t{1} << 40);  // far outside the region
    c.key = rkey;
    if (owner_saw.ok())
      owner_saw = link.owner->SendFrame(kOfiChunkFrame, c.Encode(), Deadline::AfterMs(2000));
    if (owner_saw.ok()) owner_saw = link.owner->RecvFrame(&type, &payload, Deadline::AfterMs(5000));
    if (owner_saw.ok() && type == kOfiErrorFrame) owner_saw = OfiDecodeError(payload, "requester");
  });
  UniqueFd sink(::open((dir.path() + "/bad.out").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
  Status st = requester->PullNow(*link.requester, kMiB, *reply_args, sink.get(), nullptr);
  fake_owner.join();
  std::cout << "[ info       ] requester saw: " << st.ToString() << std::endl;
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("reading chunk 0"), std::string::npos) << st.ToString();
  EXPECT_FALSE(owner_saw.ok()) << "the owner was not told";
  EXPECT_TRUE(link.requester->broken());
  const std::string data = Pattern(2 * kMiB + 1, 4);
  Outcome o = Transfer(*owner, *requester, dir.path(), "after", data);
  ASSERT_TRUE(o.push.ok() && o.pull.ok()) << o.push.ToString() << " / " << o.pull.ToString();
  EXPECT_TRUE(ReadAll(dir.path() + "/after.out") == data);
}

TEST(OfiTransport, PeersWithAnotherProviderOrGarbageAreRefused) {
  TempDir dir;
  std::unique_ptr<Transport> t = MakeOfi();
  Source s = MakeSource(dir.path() + "/big", Pattern(kMiB, 5));
  {
    Link link = MakeLink();
    const std::string args = OfiRequestArgs{"bogus;ofi_rxm", "h", 1 << 20, 4}.Encode();
    Status st = t->PushNow(*link.owner, s.src, args, nullptr);
    EXPECT_EQ(st.code(), DYAD_RC_MARGO_BAD_PROTO) << st.ToString();
    EXPECT_NE(st.message().find("bogus;ofi_rxm"), std::string::npos) << st.ToString();
    EXPECT_NE(st.message().find("DYAD_OFI_PROVIDER"), std::string::npos) << st.ToString();
    EXPECT_TRUE(link.owner->broken());
  }
  {
    Link link = MakeLink();
    EXPECT_EQ(t->PushNow(*link.owner, s.src, "not ofi args", nullptr).code(), DYAD_RC_BADUNPACK);
  }
  {
    Link link = MakeLink();
    Result<std::string> reply = t->ReplyArgs(s.src);
    ASSERT_TRUE(reply.ok());
    OfiReplyArgs r;
    ASSERT_TRUE(r.Decode(*reply).ok());
    r.provider = "elsewhere";
    UniqueFd sink(::open((dir.path() + "/o").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
    Status st = t->PullNow(*link.requester, kMiB, r.Encode(), sink.get(), nullptr);
    EXPECT_EQ(st.code(), DYAD_RC_MARGO_BAD_PROTO) << st.ToString();
    EXPECT_EQ(t->PullNow(*link.requester, kMiB, "garbage", sink.get(), nullptr).code(),
              DYAD_RC_BADUNPACK);
  }
}

TEST(OfiTransport, UnknownProviderIsAClearError) {
  ScopedEnv env("DYAD_OFI_PROVIDER", "no-such-provider");
  std::unique_ptr<Transport> t = MakeOfi();
  Status st = t->Warm();
  EXPECT_EQ(st.code(), DYAD_RC_MARGO_BAD_PROTO) << st.ToString();
  EXPECT_NE(st.message().find("no-such-provider"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("fi_info"), std::string::npos) << st.ToString();
  EXPECT_NE(t->Probe().find("unavailable"), std::string::npos) << t->Probe();
}

// Issue 26 item 8: tcp;ofi_rxm ignores the domain in fi_getinfo's hints,
// so DYAD_OFI_DOMAIN was ignored (eth0 picked whatever it said). Now a
// domain that is offered is used, and one that is not is a clear error.
TEST(OfiTransport, Issue26Item8_DomainIsHonouredOrAClearError) {
  {
    ScopedEnv env("DYAD_OFI_DOMAIN", "nosuchdev");
    std::unique_ptr<Transport> t = MakeOfi();
    Status st = t->Warm();
    EXPECT_EQ(st.code(), DYAD_RC_MARGO_BAD_PROTO) << st.ToString();
    EXPECT_NE(st.message().find("DYAD_OFI_DOMAIN=nosuchdev"), std::string::npos) << st.ToString();
    EXPECT_NE(st.message().find("domains offered"), std::string::npos) << st.ToString();
  }
  if (Provider() != "tcp") GTEST_SKIP() << "the loopback domain is a tcp;ofi_rxm case";
  ScopedEnv env("DYAD_OFI_DOMAIN", "lo");
  std::unique_ptr<Transport> t = MakeOfi();
  ASSERT_TRUE(t->Warm().ok());
  const std::string d = t->Details();
  EXPECT_NE(d.find("(domain lo,"), std::string::npos) << d;
  EXPECT_NE(d.find("DYAD_OFI_DOMAIN=lo"), std::string::npos) << d;
}

TEST(OfiTransport, OneBufferPerPoolServesConcurrentTransfersInTurn) {
  ScopedEnv env("DYAD_OFI_POOL_BUFFERS", "1");
  TempDir dir;
  std::unique_ptr<Transport> owner = MakeOfi(256 * 1024);
  std::unique_ptr<Transport> requester = MakeOfi(256 * 1024);
  std::vector<std::string> data;
  std::vector<Outcome> out(3);
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) data.push_back(Pattern(3 * kMiB + static_cast<uint64_t>(i), 10 + i));
  for (int i = 0; i < 3; ++i)
    threads.emplace_back([&, i] {
      out[i] = Transfer(*owner, *requester, dir.path(), "c" + std::to_string(i), data[i]);
    });
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(out[i].push.ok() && out[i].pull.ok())
        << out[i].push.ToString() << " / " << out[i].pull.ToString();
    EXPECT_TRUE(ReadAll(dir.path() + "/c" + std::to_string(i) + ".out") == data[i]);
  }
  EXPECT_NE(owner->Details().find("1 send of at most 1"), std::string::npos) << owner->Details();
}

}  // namespace
}  // namespace dyad

#else

TEST(OfiTransport, NotBuilt) { GTEST_SKIP() << "built without libfabric (DYAD_ENABLE_OFI)"; }

#endif  // DYAD_HAVE_OFI
