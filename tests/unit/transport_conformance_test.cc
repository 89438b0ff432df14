// transport_conformance_test.cc: one behavioural suite that every transport
// in TransportNames() must pass.
//
// Each case emulates a real fetch on a session Channel: the requester sends a
// FetchRequest frame, the owner answers with a FetchReply frame and Push()es,
// and the requester Pull()s into an AtomicFile and commits it. Both sides run
// concurrently (owner on its own thread) and share one Transport instance,
// as the two services' transfers would share theirs. Sessions are a Unix
// socketpair and, for transports that can cross nodes, a real 127.0.0.1 TCP
// connection.
//
// The contract checked: exact bytes land (empty to > 4 GiB), a session is
// reusable after a good transfer, every failure (truncated source, a peer
// that closes or stalls) is reported within a bounded time and never leaves
// a final file, and memory does not grow with the file size. Throughputs are
// printed for information only.
//
// The ucx transport (when compiled in) runs over UCX_TLS=tcp unless the
// environment already chooses (e.g. UCX_TLS=shm or self,tcp), and the ofi
// transport over FI_PROVIDER=tcp (tcp;ofi_rxm) unless the environment
// chooses (e.g. FI_PROVIDER=shm); the settings are made before anything
// creates a transport, since UCX reads its environment once, in
// ucp_config_read, and libfabric when it is first called.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/fsutil.h"
#include "common/net.h"
#include "common/runtime.h"
#include "common/wire.h"
#include "proto/auth.h"
#include "proto/protocol.h"
#include "transport/local/local_transport.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/transport.h"
#include "util.h"

namespace dyad {
namespace {

// Runs during static initialization, before the suite's parameters (which
// create transports) are built further down in this file.
[[maybe_unused]] const bool g_ucx_env_set = [] {
  // (UCX_WARN_UNUSED_ENV_VARS cannot be set here: libucs reads it when it
  // is loaded, before any static initializer of this file runs.)
  ::setenv("UCX_TLS", "tcp", /*overwrite=*/0);
  ::setenv("FI_PROVIDER", "tcp", /*overwrite=*/0);
  return true;
}();

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;
constexpr uint64_t kGiB = 1024 * kMiB;
// Generous bound for control messages; only reached when something hangs.
constexpr int64_t kRpcMs = 10000;

// ---------------------------------------------------------------------------
// Files and directories.

std::string BaseTempDir() {
  const char* env = std::getenv("DYAD_TEST_TMPDIR");
  std::string dir = (env != nullptr && *env != '\0') ? env : testing::TempDir();
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}

std::string MakeTempDir(const std::string& parent, const std::string& tag) {
  return testutil::MakeTempDir("dyad-transport-" + tag + ".", parent);
}

using testutil::RemoveTree;

// A fresh directory under BaseTempDir() removed with everything in it when
// the test ends, also when it fails.
struct ScopedTempDir : testutil::TempDir {
  explicit ScopedTempDir(const std::string& tag)
      : testutil::TempDir("dyad-transport-" + tag + ".", BaseTempDir()),
        path(testutil::TempDir::path()) {}
  const std::string path;
};

// A parent directory with room for `bytes` more. Prefers tmpfs for very
// large outputs: writing gigabytes to a disk-backed page cache soon runs
// into dirty-page throttling, which would measure the disk, not the
// transport.
std::string RoomyParent(uint64_t bytes) {
  const char* env = std::getenv("DYAD_TEST_TMPDIR");
  if (env != nullptr && *env != '\0') return BaseTempDir();
  struct statvfs vs;
  if (::statvfs("/dev/shm", &vs) == 0 &&
      static_cast<uint64_t>(vs.f_bavail) * vs.f_frsize > bytes + 2 * kGiB)
    return "/dev/shm";
  return BaseTempDir();
}

uint64_t SplitMix(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void FillPseudoRandom(char* p, size_t n, uint64_t* state) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t v = SplitMix(state);
    std::memcpy(p + i, &v, 8);
  }
  if (i < n) {
    const uint64_t v = SplitMix(state);
    std::memcpy(p + i, &v, n - i);
  }
}

// Writes `size` pseudo-random bytes (a stream fixed by `seed`) in 1 MiB
// pieces, so even the 1 GiB file never sits in this process's memory.
Status WriteRandomFile(const std::string& path, uint64_t size, uint64_t seed) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd.valid()) return StatusFromErrno(errno, "create " + path);
  std::vector<char> buf(kMiB);
  uint64_t state = seed;
  for (uint64_t done = 0; done < size;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), size - done));
    FillPseudoRandom(buf.data(), n, &state);
    DYAD_RETURN_IF_ERROR(WriteFully(fd.get(), buf.data(), n));
    done += n;
  }
  return Status::OK();
}

// A sparse file of `size` bytes with short markers written at `offsets`.
std::string Marker(uint64_t offset) { return "@" + std::to_string(offset) + "!"; }

Status WriteSparseFile(const std::string& path, uint64_t size,
                       const std::vector<uint64_t>& offsets) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd.valid()) return StatusFromErrno(errno, "create " + path);
  if (::ftruncate(fd.get(), static_cast<off_t>(size)) != 0)
    return StatusFromErrno(errno, "ftruncate " + path);
  for (uint64_t off : offsets) {
    const std::string m = Marker(off);
    if (::pwrite(fd.get(), m.data(), m.size(), static_cast<off_t>(off)) !=
        static_cast<ssize_t>(m.size()))
      return StatusFromErrno(errno, "pwrite " + path);
  }
  return Status::OK();
}

uint64_t FileSize(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return UINT64_MAX;
  return static_cast<uint64_t>(st.st_size);
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

std::string ReadAt(const std::string& path, uint64_t offset, size_t len) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  std::string out(len, '\0');
  if (!fd.valid()) return "<cannot open>";
  const ssize_t n = ::pread(fd.get(), out.data(), len, static_cast<off_t>(offset));
  out.resize(n > 0 ? static_cast<size_t>(n) : 0);
  return out;
}

// Compares two files byte for byte with bounded buffers.
testing::AssertionResult SameContent(const std::string& a, const std::string& b) {
  UniqueFd fa(::open(a.c_str(), O_RDONLY | O_CLOEXEC));
  UniqueFd fb(::open(b.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fa.valid() || !fb.valid())
    return testing::AssertionFailure() << "cannot open " << a << " or " << b;
  const uint64_t sa = FileSize(a), sb = FileSize(b);
  if (sa != sb) return testing::AssertionFailure() << "sizes differ: " << sa << " vs " << sb;
  std::vector<char> ba(kMiB), bb(kMiB);
  for (uint64_t off = 0; off < sa;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kMiB, sa - off));
    if (::pread(fa.get(), ba.data(), n, static_cast<off_t>(off)) != static_cast<ssize_t>(n) ||
        ::pread(fb.get(), bb.data(), n, static_cast<off_t>(off)) != static_cast<ssize_t>(n))
      return testing::AssertionFailure() << "short read at " << off;
    if (std::memcmp(ba.data(), bb.data(), n) != 0) {
      size_t i = 0;
      while (ba[i] == bb[i]) ++i;
      return testing::AssertionFailure() << "first difference at byte " << off + i;
    }
    off += n;
  }
  return testing::AssertionSuccess();
}

std::vector<std::string> PartFilesIn(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind(kPartPrefix, 0) == 0) out.push_back(it->path().string());
  }
  return out;
}

// Peak resident set size of this process in bytes (VmHWM), 0 if unknown.
uint64_t PeakRssBytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::strtoull(line.c_str() + 6, nullptr, 10) * 1024;
  }
  return 0;
}

// Lets VmHWM measure from now on (Linux >= 4.0); harmless if refused.
void ResetPeakRss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
}

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

double MiBPerSecond(uint64_t bytes, double seconds) {
  return seconds > 0 ? static_cast<double>(bytes) / static_cast<double>(kMiB) / seconds : 0.0;
}

// Source files several cases share (created once per run, removed at exit).
class SharedSources : public testing::Environment {
 public:
  // Holds up to 1 GiB + 64 MiB, hence a roomy (preferably tmpfs) parent.
  void SetUp() override { root_ = MakeTempDir(RoomyParent(kGiB + 64 * kMiB), "shared"); }
  void TearDown() override { RemoveTree(root_); }
  const std::string& root() const { return root_; }

  Status Ensure(const std::string& upath, uint64_t size) {
    std::lock_guard<std::mutex> lock(mu_);
    if (root_.empty()) return Status(DYAD_RC_BADFIO, "no shared temporary directory");
    if (made_.count(upath) != 0) return Status::OK();
    uint64_t seed = size;
    for (char c : upath) seed = seed * 131 + static_cast<unsigned char>(c);
    DYAD_RETURN_IF_ERROR(WriteRandomFile(root_ + "/" + upath, size, seed));
    made_[upath] = size;
    return Status::OK();
  }

 private:
  std::mutex mu_;
  std::string root_;
  std::map<std::string, uint64_t> made_;
};

SharedSources* const g_shared =
    static_cast<SharedSources*>(testing::AddGlobalTestEnvironment(new SharedSources));

// ---------------------------------------------------------------------------
// The two ends of a fetch, built from the same steps the services take.

// kSealed: loopback TCP protected as an authenticated service session is by
// default (integrity records, common/seal.h), with keys both ends share.
enum class LinkKind { kSocketPair, kLoopback, kSealed };

struct Link {
  std::unique_ptr<Channel> owner;
  std::unique_ptr<Channel> requester;
};

Status MakeLink(LinkKind kind, Link* link) {
  if (kind == LinkKind::kSocketPair) {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
      return StatusFromErrno(errno, "socketpair");
    link->owner = std::make_unique<Channel>(UniqueFd(sv[0]), Trust::kAuthenticated);
    link->requester = std::make_unique<Channel>(UniqueFd(sv[1]), Trust::kAuthenticated);
    return Status::OK();
  }
  Result<SocketAddress> any = ParseAddress("127.0.0.1:0");
  if (!any.ok()) return any.status();
  Result<UniqueFd> lfd = Listen(*any);
  if (!lfd.ok()) return lfd.status();
  Result<SocketAddress> bound = BoundAddress(lfd->get());
  if (!bound.ok()) return bound.status();
  // The kernel completes the handshake from the backlog, so connecting
  // before accepting on one thread is fine.
  Result<UniqueFd> cfd = Connect(*bound, Deadline::AfterMs(kRpcMs));
  if (!cfd.ok()) return cfd.status();
  Result<UniqueFd> afd = Accept(lfd->get(), Deadline::AfterMs(kRpcMs));
  if (!afd.ok()) return afd.status();
  link->owner = std::make_unique<Channel>(std::move(afd).value(), Trust::kAuthenticated);
  link->requester = std::make_unique<Channel>(std::move(cfd).value(), Trust::kAuthenticated);
  if (kind == LinkKind::kSealed) {
    unsigned char keys[2 * kSealKeySize];
    DYAD_RETURN_IF_ERROR(RandomBytes(keys, sizeof keys));
    const LinkProtection level = LinkProtection::kIntegrity;
    auto o_send = RecordCipher::Create(keys, level, true);
    auto o_recv = RecordCipher::Create(keys + kSealKeySize, level, false);
    auto r_send = RecordCipher::Create(keys + kSealKeySize, level, true);
    auto r_recv = RecordCipher::Create(keys, level, false);
    if (!o_send.ok() || !o_recv.ok() || !r_send.ok() || !r_recv.ok())
      return Status(DYAD_RC_SYSFAIL, "record ciphers");
    link->owner->Protect(level, std::move(*o_send), std::move(*o_recv));
    link->requester->Protect(level, std::move(*r_send), std::move(*r_recv));
  }
  return Status::OK();
}

struct OpenedSource {
  UniqueFd fd;
  FileSource src;
};

// Owner: receive the FetchRequest and open the named file under `root`.
Status ReceiveRequest(Channel& ch, const std::string& root, FetchRequest* req, OpenedSource* out) {
  uint16_t type = 0;
  std::string payload;
  DYAD_RETURN_IF_ERROR(ch.RecvFrame(&type, &payload, Deadline::AfterMs(kRpcMs)));
  Decoder d(payload);
  if (type != static_cast<uint16_t>(MsgType::kFetch) || !req->DecodeFrom(d))
    return Status(DYAD_RC_BADUNPACK, "not a fetch request");
  Result<UniqueFd> fd = OpenBeneath(root, req->upath, O_RDONLY);
  if (!fd.ok()) return fd.status();
  struct stat st;
  if (::fstat(fd->get(), &st) != 0) return StatusFromErrno(errno, "fstat");
  out->fd = std::move(fd).value();
  out->src.fd = out->fd.get();
  out->src.size = static_cast<uint64_t>(st.st_size);
  out->src.version = MtimeNs(st);
  out->src.path = root + "/" + req->upath;
  out->src.root = root;
  out->src.upath = req->upath;
  out->src.dev = st.st_dev;
  out->src.ino = st.st_ino;
  return Status::OK();
}

// Owner: the FetchReply, carrying the transport's reply arguments.
Status SendReply(Transport& t, Channel& ch, const FileSource& src) {
  Result<std::string> args = t.ReplyArgs(src);
  if (!args.ok()) return args.status();
  FetchReply reply;
  reply.size = src.size;
  reply.version = src.version;
  reply.transport_args = *args;
  Encoder e;
  reply.EncodeTo(e);
  return ch.SendFrame(static_cast<uint16_t>(MsgType::kReply), EncodeReply(Status::OK(), e.Take()),
                      Deadline::AfterMs(kRpcMs));
}

struct OwnerResult {
  Status st;
  TransferStats stats;
  double push_seconds = 0;
};

// Owner: one whole fetch, as the service's file server does it.
OwnerResult ServeFetch(Transport& t, Channel& ch, const std::string& root) {
  OwnerResult r;
  FetchRequest req;
  OpenedSource opened;
  r.st = ReceiveRequest(ch, root, &req, &opened);
  if (!r.st.ok()) return r;
  r.st = SendReply(t, ch, opened.src);
  if (!r.st.ok()) return r;
  const auto t0 = std::chrono::steady_clock::now();
  r.st = t.PushNow(ch, opened.src, req.transport_args, &r.stats);
  r.push_seconds = Seconds(std::chrono::steady_clock::now() - t0);
  return r;
}

// Requester: FetchRequest out, FetchReply back.
Result<FetchReply> RequestFile(Transport& t, Channel& ch, const std::string& upath) {
  Result<std::string> args = t.PrepareRequest();
  if (!args.ok()) return args.status();
  FetchRequest req;
  req.upath = upath;
  req.transport = t.name();
  req.transport_args = *args;
  Encoder e;
  req.EncodeTo(e);
  std::string body;
  DYAD_RETURN_IF_ERROR(CallRpc(ch, MsgType::kFetch, e.Take(), &body, Deadline::AfterMs(kRpcMs)));
  FetchReply reply;
  Decoder d(body);
  if (!reply.DecodeFrom(d)) return Status(DYAD_RC_BADUNPACK, "bad fetch reply");
  return reply;
}

struct PullResult {
  Status st;
  TransferStats stats;
  double pull_seconds = 0;
  uint64_t size = 0;
};

// Requester: land the promised bytes in an AtomicFile and commit it; on any
// failure the AtomicFile removes its temporary when it goes out of scope.
PullResult PullInto(Transport& t, Channel& ch, const FetchReply& reply, const std::string& dst_root,
                    const std::string& upath) {
  PullResult r;
  r.size = reply.size;
  AtomicFile file;
  r.st = file.Create(dst_root, upath);
  if (!r.st.ok()) return r;
  const auto t0 = std::chrono::steady_clock::now();
  r.st = t.PullNow(ch, reply.size, reply.transport_args, file.fd(), &r.stats);
  r.pull_seconds = Seconds(std::chrono::steady_clock::now() - t0);
  if (!r.st.ok()) return r;
  r.st = file.Commit(reply.version, /*fsync_data=*/false);
  return r;
}

PullResult Fetch(Transport& t, Channel& ch, const std::string& upath, const std::string& dst_root) {
  Result<FetchReply> reply = RequestFile(t, ch, upath);
  if (!reply.ok()) {
    PullResult r;
    r.st = reply.status();
    return r;
  }
  return PullInto(t, ch, *reply, dst_root, upath);
}

// ---------------------------------------------------------------------------
// The suite.

struct Param {
  std::string transport;
  LinkKind link;
};

std::string ParamName(const testing::TestParamInfo<Param>& info) {
  switch (info.param.link) {
    case LinkKind::kSocketPair:
      return info.param.transport + "_socketpair";
    case LinkKind::kLoopback:
      return info.param.transport + "_loopback";
    case LinkKind::kSealed:
      return info.param.transport + "_sealed";
  }
  return info.param.transport;
}

// Every transport over a socketpair; those that may cross nodes also over
// real TCP on 127.0.0.1.
std::vector<Param> AllParams() {
  std::vector<Param> out;
  for (const std::string& name : TransportNames()) {
    out.push_back({name, LinkKind::kSocketPair});
    Result<std::unique_ptr<Transport>> t = CreateTransport(name, TransportOptions());
    if (t.ok() && !(*t)->caps().same_node_only) {
      out.push_back({name, LinkKind::kLoopback});
      out.push_back({name, LinkKind::kSealed});
    }
  }
  return out;
}

// Transports whose transfer is driven by the session (tcp streams the bytes
// on it, ucx signals every chunk and credit on it): when the session fails,
// their transfer must fail. The others (the local transport copies from the
// owner's path) may still succeed, but must stay bounded.
// Transports whose file bytes travel on the session or its peer's memory
// (not a path handed over): their rows say so, or they register buffers.
bool SessionCarriesData(const std::string& transport) {
  const BackendRow* row = FindRow(BackendKind::kTransport, transport);
  return row != nullptr &&
         (row->transport_caps.data_on_session || row->transport_caps.needs_registration);
}

class TransportConformance : public testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    // Normal transfers get a roomy bound: it fails a hung test, nothing more.
    ASSERT_NO_FATAL_FAILURE(UseIdle(5000));
    ASSERT_TRUE(MakeLink(GetParam().link, &link_).ok());
    dst_root_ = MakeTempDir(BaseTempDir(), "dst");
    own_root_ = MakeTempDir(BaseTempDir(), "src");
    ASSERT_FALSE(dst_root_.empty());
    ASSERT_FALSE(own_root_.empty());
    ASSERT_FALSE(g_shared->root().empty());
  }

  void TearDown() override {
    RemoveTree(dst_root_);
    RemoveTree(own_root_);
  }

  void UseIdle(int64_t idle_ms) {
    TransportOptions options;
    options.idle_ms = idle_ms;
    Result<std::unique_ptr<Transport>> t = CreateTransport(GetParam().transport, options);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    transport_ = std::move(t).value();
  }

  bool data_on_session() const { return SessionCarriesData(GetParam().transport); }

  struct Both {
    OwnerResult owner;
    PullResult pull;
  };

  // One fetch with the owner on its own thread.
  Both Transfer(const std::string& src_root, const std::string& upath) {
    Both b;
    std::thread owner([&] { b.owner = ServeFetch(*transport_, *link_.owner, src_root); });
    b.pull = Fetch(*transport_, *link_.requester, upath, dst_root_);
    owner.join();
    return b;
  }

  // Transfers `src_root`/`upath` and checks the committed copy is identical.
  Both ExpectExactCopy(const std::string& src_root, const std::string& upath) {
    Both b = Transfer(src_root, upath);
    EXPECT_TRUE(b.owner.st.ok()) << b.owner.st.ToString();
    EXPECT_TRUE(b.pull.st.ok()) << b.pull.st.ToString();
    EXPECT_TRUE(SameContent(src_root + "/" + upath, dst_root_ + "/" + upath));
    EXPECT_TRUE(PartFilesIn(dst_root_).empty());
    return b;
  }

  void ExpectNoFinalFile(const std::string& upath) {
    EXPECT_FALSE(Exists(dst_root_ + "/" + upath)) << "a failed transfer left a final file";
    EXPECT_TRUE(PartFilesIn(dst_root_).empty()) << "a failed transfer left a temporary";
  }

  void ReportThroughput(const char* what, uint64_t bytes, const Both& b) {
    std::cout << "[ throughput ] " << ParamName({GetParam(), 0}) << " " << what << ": "
              << MiBPerSecond(bytes, b.pull.pull_seconds) << " MiB/s (pull " << b.pull.pull_seconds
              << " s, push " << b.owner.push_seconds << " s)" << std::endl;
  }

  std::unique_ptr<Transport> transport_;
  Link link_;
  std::string dst_root_;
  std::string own_root_;
};

TEST_P(TransportConformance, EmptyFile) {
  ASSERT_TRUE(WriteRandomFile(own_root_ + "/empty", 0, 1).ok());
  Both b = ExpectExactCopy(own_root_, "empty");
  EXPECT_EQ(FileSize(dst_root_ + "/empty"), 0u);
  EXPECT_EQ(b.pull.stats.bytes, 0u);
  EXPECT_EQ(b.owner.stats.bytes, 0u);
}

TEST_P(TransportConformance, OneByte) {
  ASSERT_TRUE(WriteRandomFile(own_root_ + "/one", 1, 2).ok());
  Both b = ExpectExactCopy(own_root_, "one");
  EXPECT_GE(b.pull.stats.bytes + b.owner.stats.bytes, 1u);
}

TEST_P(TransportConformance, FourKiB) {
  ASSERT_TRUE(WriteRandomFile(own_root_ + "/four_k", 4 * kKiB, 3).ok());
  ExpectExactCopy(own_root_, "four_k");
}

TEST_P(TransportConformance, OneMiBPlusSevenIntoSubdirectory) {
  ASSERT_EQ(::mkdir((own_root_ + "/sub").c_str(), 0755), 0);
  ASSERT_TRUE(WriteRandomFile(own_root_ + "/sub/odd", kMiB + 7, 4).ok());
  ExpectExactCopy(own_root_, "sub/odd");
}

TEST_P(TransportConformance, SixtyFourMiBRandom) {
  ASSERT_TRUE(g_shared->Ensure("random64", 64 * kMiB).ok());
  Both b = ExpectExactCopy(g_shared->root(), "random64");
  EXPECT_EQ(FileSize(dst_root_ + "/random64"), 64 * kMiB);
  ReportThroughput("64 MiB", 64 * kMiB, b);
}

TEST_P(TransportConformance, SparseFileLargerThanFourGiB) {
  if (data_on_session() && GetParam().link != LinkKind::kLoopback)
    GTEST_SKIP() << "streamed over unprotected loopback TCP only, to keep the suite short";
  // Past 4 GiB so any 32-bit size or offset would break; 4.5 GiB rather
  // than 5 because streaming it took 13-40 s on a loaded 2-core VM, most of
  // it in the kernel zero-filling pages.
  const uint64_t size = 4 * kGiB + kGiB / 2;
  const std::vector<uint64_t> marks = {0, 4 * kGiB - 5, 4 * kGiB + 12345, size - 32};
  ASSERT_TRUE(WriteSparseFile(own_root_ + "/huge", size, marks).ok());
  // The copy is mostly zeros that a streaming transport writes out in full.
  RemoveTree(dst_root_);
  dst_root_ = MakeTempDir(RoomyParent(size), "dst-huge");
  ASSERT_FALSE(dst_root_.empty());

  Both b = Transfer(own_root_, "huge");
  ASSERT_TRUE(b.owner.st.ok()) << b.owner.st.ToString();
  ASSERT_TRUE(b.pull.st.ok()) << b.pull.st.ToString();
  const std::string out = dst_root_ + "/huge";
  EXPECT_EQ(FileSize(out), size);
  for (uint64_t off : marks) EXPECT_EQ(ReadAt(out, off, Marker(off).size()), Marker(off));
  for (uint64_t off : {kGiB, 4 * kGiB + 4 * kKiB, 4 * kGiB + 64 * kKiB, size - 100 * kMiB})
    EXPECT_EQ(ReadAt(out, off, 16), std::string(16, '\0')) << "at " << off;
  struct stat st;
  ASSERT_EQ(::stat(out.c_str(), &st), 0);
  std::cout << "[ info       ] " << ParamName({GetParam(), 0})
            << " 4.5 GiB sparse: " << MiBPerSecond(size, b.pull.pull_seconds)
            << " MiB/s logical, destination uses "
            << static_cast<uint64_t>(st.st_blocks) * 512 / kKiB << " KiB on disk" << std::endl;
}

TEST_P(TransportConformance, ManySmallTransfersReuseOneSession) {
  constexpr int kCount = 200;
  std::vector<std::string> names;
  for (int i = 0; i < kCount; ++i) {
    // Mostly small, some empty, some past the receive-path thresholds.
    uint64_t size = static_cast<uint64_t>((i * 7919) % 6000);
    if (i % 17 == 0) size = 0;
    if (i % 50 == 7) size = 100 * kKiB + static_cast<uint64_t>(i);
    names.push_back("small_" + std::to_string(i));
    ASSERT_TRUE(WriteRandomFile(own_root_ + "/" + names.back(), size, 1000 + i).ok());
  }
  Status owner_status;
  std::thread owner([&] {
    for (int i = 0; i < kCount; ++i) {
      OwnerResult r = ServeFetch(*transport_, *link_.owner, own_root_);
      if (!r.st.ok()) {
        owner_status = r.st.Annotate("transfer " + std::to_string(i));
        return;
      }
    }
  });
  for (int i = 0; i < kCount; ++i) {
    PullResult r = Fetch(*transport_, *link_.requester, names[i], dst_root_);
    ASSERT_TRUE(r.st.ok()) << "transfer " << i << ": " << r.st.ToString();
  }
  owner.join();
  EXPECT_TRUE(owner_status.ok()) << owner_status.ToString();
  EXPECT_FALSE(link_.owner->broken());
  EXPECT_FALSE(link_.requester->broken());
  for (const std::string& n : names)
    ASSERT_TRUE(SameContent(own_root_ + "/" + n, dst_root_ + "/" + n)) << n;
}

TEST_P(TransportConformance, SourceTruncatedMidTransferFailsWithoutFinalFile) {
  const std::string src = own_root_ + "/shrinks";
  ASSERT_TRUE(WriteRandomFile(src, 64 * kMiB, 5).ok());
  OwnerResult owner_result;
  std::thread owner([&] { owner_result = ServeFetch(*transport_, *link_.owner, own_root_); });
  Result<FetchReply> reply = RequestFile(*transport_, *link_.requester, "shrinks");
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  ASSERT_EQ(reply->size, 64 * kMiB);
  // Let a streaming owner fill the socket buffers and block mid-file, then
  // cut the file below what it promised.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ASSERT_EQ(::truncate(src.c_str(), static_cast<off_t>(kMiB)), 0);
  PullResult pulled = PullInto(*transport_, *link_.requester, *reply, dst_root_, "shrinks");
  owner.join();
  EXPECT_FALSE(pulled.st.ok());
  std::cout << "[ info       ] requester saw: " << pulled.st.ToString() << std::endl;
  if (data_on_session()) {
    EXPECT_FALSE(owner_result.st.ok());
    std::cout << "[ info       ] owner saw: " << owner_result.st.ToString() << std::endl;
    EXPECT_TRUE(link_.owner->broken());
    EXPECT_TRUE(link_.requester->broken());
  }
  ExpectNoFinalFile("shrinks");
}

// Issue 25 item 11: a file rewritten in place on its owner while it is sent
// (same size, new bytes) is the owner's business (its verdict says the file
// changed), never an integrity failure of the link: with integrity the tcp
// owner used to seal the bytes it read and let sendfile re-read the pages,
// so the requester saw DYAD_RC_AUTH ("altered in transit").
TEST_P(TransportConformance, SourceRewrittenMidTransferIsNotAnIntegrityFailure) {
  const std::string src = own_root_ + "/rewritten";
  ASSERT_TRUE(WriteRandomFile(src, 64 * kMiB, 9).ok());
  OwnerResult owner_result;
  std::thread owner([&] { owner_result = ServeFetch(*transport_, *link_.owner, own_root_); });
  Result<FetchReply> reply = RequestFile(*transport_, *link_.requester, "rewritten");
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  // Let a streaming owner fill the socket buffers and block mid-file (with
  // chunks read and queued), then rewrite every byte in place.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  {
    UniqueFd fd(::open(src.c_str(), O_WRONLY | O_CLOEXEC));
    ASSERT_TRUE(fd.valid());
    std::vector<char> buf(kMiB);
    uint64_t state = 77;
    for (uint64_t done = 0; done < 64 * kMiB; done += buf.size()) {
      FillPseudoRandom(buf.data(), buf.size(), &state);
      ASSERT_TRUE(WriteFully(fd.get(), buf.data(), buf.size()).ok());
    }
  }
  PullResult pulled = PullInto(*transport_, *link_.requester, *reply, dst_root_, "rewritten");
  owner.join();
  std::cout << "[ info       ] requester saw: " << pulled.st.ToString() << std::endl;
  EXPECT_NE(pulled.st.code(), DYAD_RC_AUTH) << pulled.st.ToString();
  EXPECT_TRUE(PartFilesIn(dst_root_).empty()) << "the transfer left a temporary";
}

TEST_P(TransportConformance, OwnerClosesMidTransfer) {
  constexpr int64_t kIdleMs = 500;
  ASSERT_NO_FATAL_FAILURE(UseIdle(kIdleMs));
  ASSERT_TRUE(WriteRandomFile(own_root_ + "/cut", 8 * kMiB, 6).ok());
  Status owner_status;
  std::thread owner([&] {
    FetchRequest req;
    OpenedSource opened;
    owner_status = ReceiveRequest(*link_.owner, own_root_, &req, &opened);
    if (owner_status.ok()) owner_status = SendReply(*transport_, *link_.owner, opened.src);
    // Emulates an owner that dies after sending part of the data (as a
    // sealed chunk where the tcp transport would seal it).
    if (owner_status.ok() && GetParam().link == LinkKind::kSealed &&
        GetParam().transport == "tcp") {
      std::string part(100 * kKiB, '\0');
      if (::pread(opened.fd.get(), part.data(), part.size(), 0) !=
          static_cast<ssize_t>(part.size()))
        owner_status = StatusFromErrno(errno, "pread");
      else
        owner_status = link_.owner->SendFrame(static_cast<uint16_t>(MsgType::kFileData), part,
                                              Deadline::AfterMs(kRpcMs));
    } else if (owner_status.ok()) {
      owner_status = link_.owner->SendFileRange(opened.fd.get(), 0, 100 * kKiB, kRpcMs);
    }
    link_.owner.reset();
  });
  Result<FetchReply> reply = RequestFile(*transport_, *link_.requester, "cut");
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  const auto t0 = std::chrono::steady_clock::now();
  PullResult pulled = PullInto(*transport_, *link_.requester, *reply, dst_root_, "cut");
  const double waited = Seconds(std::chrono::steady_clock::now() - t0);
  owner.join();
  ASSERT_TRUE(owner_status.ok()) << owner_status.ToString();
  EXPECT_LT(waited, (kIdleMs + 1500) / 1000.0);
  if (data_on_session()) {
    ASSERT_FALSE(pulled.st.ok());
    // ucx and ofi may read the raw bytes as a frame header (not a DYAD
    // peer) before they see the close.
    const bool framed = GetParam().transport == "ucx" || GetParam().transport == "ofi";
    const bool garbage = framed && pulled.st.code() == DYAD_RC_BADUNPACK;
    if (!garbage) {
      EXPECT_EQ(pulled.st.code(), DYAD_RC_CONNLOST) << pulled.st.ToString();
    }
    EXPECT_NE(pulled.st.message().find("of 8388608 bytes"), std::string::npos)
        << pulled.st.ToString();
    ExpectNoFinalFile("cut");
  } else if (pulled.st.ok()) {
    EXPECT_TRUE(SameContent(own_root_ + "/cut", dst_root_ + "/cut"));
  } else {
    ExpectNoFinalFile("cut");
  }
}

TEST_P(TransportConformance, RequesterClosesMidTransfer) {
  constexpr int64_t kIdleMs = 500;
  ASSERT_NO_FATAL_FAILURE(UseIdle(kIdleMs));
  ASSERT_TRUE(g_shared->Ensure("random64", 64 * kMiB).ok());
  OwnerResult owner_result;
  std::thread owner(
      [&] { owner_result = ServeFetch(*transport_, *link_.owner, g_shared->root()); });
  Result<FetchReply> reply = RequestFile(*transport_, *link_.requester, "random64");
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  if (GetParam().transport == "tcp") {  // only tcp streams raw bytes on the session
    std::vector<char> some(64 * kKiB);
    ASSERT_TRUE(link_.requester->RecvAll(some.data(), some.size(), Deadline::AfterMs(kRpcMs)).ok());
  }
  // Closing with unread data in the socket is what a crashed requester does.
  const auto t0 = std::chrono::steady_clock::now();
  link_.requester.reset();
  owner.join();
  const double waited = Seconds(std::chrono::steady_clock::now() - t0);
  // sendfile's no-progress bound may be spent once per partial send, so up
  // to two idle periods can pass before the owner gives up.
  EXPECT_LT(waited, (2 * kIdleMs + 1500) / 1000.0);
  if (data_on_session()) {
    ASSERT_FALSE(owner_result.st.ok());
    std::cout << "[ info       ] owner saw: " << owner_result.st.ToString() << std::endl;
    EXPECT_TRUE(link_.owner->broken());
  }
}

TEST_P(TransportConformance, StalledOwnerTimesOut) {
  constexpr int64_t kIdleMs = 500;
  ASSERT_NO_FATAL_FAILURE(UseIdle(kIdleMs));
  ASSERT_TRUE(WriteRandomFile(own_root_ + "/stall", kMiB, 7).ok());
  std::promise<void> requester_done;
  std::future<void> done = requester_done.get_future();
  Status owner_status;
  std::thread owner([&] {
    FetchRequest req;
    OpenedSource opened;
    owner_status = ReceiveRequest(*link_.owner, own_root_, &req, &opened);
    if (owner_status.ok()) owner_status = SendReply(*transport_, *link_.owner, opened.src);
    // Replies, then sends nothing while keeping the session open.
    done.wait_for(std::chrono::milliseconds(kRpcMs));
  });
  Result<FetchReply> reply = RequestFile(*transport_, *link_.requester, "stall");
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  const auto t0 = std::chrono::steady_clock::now();
  PullResult pulled = PullInto(*transport_, *link_.requester, *reply, dst_root_, "stall");
  const double waited = Seconds(std::chrono::steady_clock::now() - t0);
  requester_done.set_value();
  owner.join();
  ASSERT_TRUE(owner_status.ok()) << owner_status.ToString();
  EXPECT_LT(waited, (kIdleMs + 1000) / 1000.0);
  if (data_on_session()) {
    EXPECT_EQ(pulled.st.code(), DYAD_RC_TIMEOUT) << pulled.st.ToString();
    // The one blocking driver names the bound (brief tp, item 4).
    EXPECT_NE(pulled.st.message().find("500 ms"), std::string::npos) << pulled.st.ToString();
    EXPECT_GE(waited, (kIdleMs - 50) / 1000.0);
    EXPECT_TRUE(link_.requester->broken());
    ExpectNoFinalFile("stall");
  }
}

TEST_P(TransportConformance, StalledRequesterTimesOut) {
  constexpr int64_t kIdleMs = 500;
  ASSERT_NO_FATAL_FAILURE(UseIdle(kIdleMs));
  ASSERT_TRUE(g_shared->Ensure("random64", 64 * kMiB).ok());
  OwnerResult owner_result;
  std::promise<void> owner_done;
  std::future<void> done = owner_done.get_future();
  std::thread owner([&] {
    owner_result = ServeFetch(*transport_, *link_.owner, g_shared->root());
    owner_done.set_value();
  });
  // Asks, then never reads.
  Result<FetchReply> reply = RequestFile(*transport_, *link_.requester, "random64");
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  const auto t0 = std::chrono::steady_clock::now();
  // Channel::SendFileRange restarts its SO_SNDTIMEO bound whenever a send
  // makes any progress, and a TCP peer that does not read still accepts a
  // trickle while its receive buffer grows, so a few idle periods can pass
  // (about 4 on loopback) before the owner gives up. Bounded, not exact.
  const bool finished =
      done.wait_for(std::chrono::milliseconds(6 * kIdleMs + 1500)) == std::future_status::ready;
  const double waited = Seconds(std::chrono::steady_clock::now() - t0);
  if (!finished) link_.requester.reset();  // unblock the owner before failing
  owner.join();
  ASSERT_TRUE(finished) << "owner did not give up on a stalled requester";
  std::cout << "[ info       ] owner gave up after " << waited
            << " s: " << owner_result.st.ToString() << std::endl;
  if (data_on_session()) {
    EXPECT_EQ(owner_result.st.code(), DYAD_RC_TIMEOUT) << owner_result.st.ToString();
    EXPECT_NE(owner_result.st.message().find("500 ms"), std::string::npos)
        << owner_result.st.ToString();
    EXPECT_GE(waited, (kIdleMs - 50) / 1000.0);
  }
}

TEST_P(TransportConformance, MemoryStaysBoundedForOneGiB) {
  ASSERT_TRUE(g_shared->Ensure("random1g", kGiB).ok());
  RemoveTree(dst_root_);
  dst_root_ = MakeTempDir(RoomyParent(kGiB), "dst-1g");
  ASSERT_FALSE(dst_root_.empty());
  // A first, small transfer sets up what a transport keeps for its life
  // (registered pools, the connection and the buffers its library keeps
  // per peer: libfabric's tcp;ofi_rxm, for one, preallocates ~100 MiB):
  // the bound is on what moving 1 GiB adds to that.
  ASSERT_TRUE(WriteRandomFile(own_root_ + "/warm", 4 * kMiB + 1, 12).ok());
  ExpectExactCopy(own_root_, "warm");
  ResetPeakRss();
  const uint64_t before = PeakRssBytes();
  Both b = Transfer(g_shared->root(), "random1g");
  const uint64_t after = PeakRssBytes();
  ASSERT_TRUE(b.owner.st.ok()) << b.owner.st.ToString();
  ASSERT_TRUE(b.pull.st.ok()) << b.pull.st.ToString();
  ReportThroughput("1 GiB", kGiB, b);
  std::cout << "[ info       ] peak RSS " << before / kKiB << " KiB -> " << after / kKiB << " KiB"
            << std::endl;
  ASSERT_GT(before, 0u) << "cannot read VmHWM";
  EXPECT_LT(after - before, 64 * kMiB);
  EXPECT_TRUE(SameContent(g_shared->root() + "/random1g", dst_root_ + "/random1g"));
}

INSTANTIATE_TEST_SUITE_P(AllTransports, TransportConformance, testing::ValuesIn(AllParams()),
                         ParamName);

// ---------------------------------------------------------------------------
// Registry.

TEST(TransportRegistry, EveryListedNameCreatesThatTransport) {
  for (const std::string& name : TransportNames()) {
    Result<std::unique_ptr<Transport>> t = CreateTransport(name, TransportOptions());
    ASSERT_TRUE(t.ok()) << name << ": " << t.status().ToString();
    EXPECT_EQ((*t)->name(), name);
  }
}

TEST(TransportRegistry, ModesMapCaseInsensitively) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"FLUX_RPC", "tcp"}, {"flux_rpc", "tcp"}, {"TCP", "tcp"},     {"Tcp", "tcp"},
      {"", "tcp"},         {"LOCAL", "local"},  {"local", "local"},
#ifdef DYAD_HAVE_UCX
      {"UCX", "ucx"},      {"ucx", "ucx"},
#endif
#ifdef DYAD_HAVE_OFI
      {"OFI", "ofi"},      {"ofi", "ofi"},      {"MARGO", "ofi"},   {"margo", "ofi"},
#endif
  };
  for (const auto& [mode, want] : cases) {
    Result<std::string> got = TransportNameForMode(mode);
    ASSERT_TRUE(got.ok()) << mode << ": " << got.status().ToString();
    EXPECT_EQ(*got, want) << mode;
    Result<std::unique_ptr<Transport>> t = CreateTransport(mode, TransportOptions());
    ASSERT_TRUE(t.ok()) << mode;
    EXPECT_EQ((*t)->name(), want);
  }
}

TEST(TransportRegistry, MissingModesExplainThemselves) {
  const std::vector<std::pair<std::string, std::string>> cases = {
#ifndef DYAD_HAVE_UCX
      {"UCX", "DYAD_ENABLE_UCX=ON"},
      {"ucx", "libucx-dev"},
#endif
#ifndef DYAD_HAVE_OFI
      {"OFI", "DYAD_ENABLE_OFI=ON"},
      {"ofi", "libfabric-dev"},
      {"MARGO", "maps to the OFI"},
#endif
      {"bogus", "TCP"},
      {"CARRIER_PIGEON", "FLUX_RPC"}};
  for (const auto& [mode, hint] : cases) {
    Result<std::string> got = TransportNameForMode(mode);
    ASSERT_FALSE(got.ok()) << mode;
    EXPECT_EQ(got.status().code(), DYAD_RC_BADDTLMODE) << mode;
    EXPECT_NE(got.status().message().find(hint), std::string::npos)
        << mode << ": " << got.status().message();
    Result<std::unique_ptr<Transport>> t = CreateTransport(mode, TransportOptions());
    ASSERT_FALSE(t.ok());
    EXPECT_EQ(t.status().code(), DYAD_RC_BADDTLMODE);
  }
}

TEST(TransportRegistry, Capabilities) {
  Result<std::unique_ptr<Transport>> tcp = CreateTransport("tcp", TransportOptions());
  Result<std::unique_ptr<Transport>> local = CreateTransport("local", TransportOptions());
  ASSERT_TRUE(tcp.ok() && local.ok());
  EXPECT_TRUE((*tcp)->caps().zero_copy_send);
  EXPECT_FALSE((*tcp)->caps().same_node_only);
  EXPECT_TRUE((*local)->caps().same_node_only);
}

// ---------------------------------------------------------------------------
// LocalTransport::CopyRange, the helper the service uses without a session.

class CopyRangeTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir(BaseTempDir(), "copy");
    ASSERT_FALSE(dir_.empty());
  }
  void TearDown() override { RemoveTree(dir_); }
  std::string dir_;
};

TEST_F(CopyRangeTest, KeepsHolesAndWritesAtTheDestinationPosition) {
  const uint64_t size = 64 * kMiB;
  const std::vector<uint64_t> marks = {0, 5 * kMiB + 3, size - 16};
  ASSERT_TRUE(WriteSparseFile(dir_ + "/src", size, marks).ok());
  UniqueFd src(::open((dir_ + "/src").c_str(), O_RDONLY | O_CLOEXEC));
  UniqueFd dst(::open((dir_ + "/dst").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  ASSERT_TRUE(src.valid() && dst.valid());
  ASSERT_TRUE(WriteFully(dst.get(), "HDR", 3).ok());
  ASSERT_EQ(::lseek(src.get(), 42, SEEK_SET), 42);
  TransferStats stats;
  Status st = LocalTransport::CopyRange(src.get(), dst.get(), size, &stats);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(stats.bytes, size);
  EXPECT_EQ(::lseek(dst.get(), 0, SEEK_CUR), static_cast<off_t>(3 + size));
  EXPECT_EQ(::lseek(src.get(), 0, SEEK_CUR), 42) << "source position must be left alone";
  const std::string out = dir_ + "/dst";
  EXPECT_EQ(FileSize(out), 3 + size);
  EXPECT_EQ(ReadAt(out, 0, 3), "HDR");
  for (uint64_t off : marks) EXPECT_EQ(ReadAt(out, 3 + off, Marker(off).size()), Marker(off));
  EXPECT_EQ(ReadAt(out, 3 + 20 * kMiB, 8), std::string(8, '\0'));
}

TEST_F(CopyRangeTest, AppendOnlyDestinationTakesEveryByte) {
  // O_APPEND defeats copy_file_range, sendfile and seeking over holes, so
  // this walks the whole fallback chain down to read/write.
  const uint64_t size = 3 * kMiB + 11;
  const std::vector<uint64_t> marks = {kMiB, size - 20};
  ASSERT_TRUE(WriteSparseFile(dir_ + "/src", size, marks).ok());
  UniqueFd src(::open((dir_ + "/src").c_str(), O_RDONLY | O_CLOEXEC));
  UniqueFd dst(::open((dir_ + "/dst").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
  ASSERT_TRUE(src.valid() && dst.valid());
  Status st = LocalTransport::CopyRange(src.get(), dst.get(), size, nullptr);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(SameContent(dir_ + "/src", dir_ + "/dst"));
}

TEST_F(CopyRangeTest, ShortSourceFails) {
  ASSERT_TRUE(WriteRandomFile(dir_ + "/src", 10, 9).ok());
  UniqueFd src(::open((dir_ + "/src").c_str(), O_RDONLY | O_CLOEXEC));
  UniqueFd dst(::open((dir_ + "/dst").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
  Status st = LocalTransport::CopyRange(src.get(), dst.get(), 20, nullptr);
  EXPECT_EQ(st.code(), DYAD_RC_BADFIO) << st.ToString();
}

// splice(2) refuses an O_APPEND sink with EINVAL, which drives the tcp
// receiver through both fallbacks: draining the pipe through its buffer, then
// plain recv into a buffer of chunk_size bytes.
TEST(TcpTransportPull, AppendOnlySinkFallsBackToBufferedReceive) {
  const std::string dir = MakeTempDir(BaseTempDir(), "tcp");
  ASSERT_FALSE(dir.empty());
  const uint64_t size = 8 * kMiB + 3;
  ASSERT_TRUE(WriteRandomFile(dir + "/src", size, 11).ok());
  TransportOptions options;
  options.chunk_size = 64 * kKiB;
  options.idle_ms = 5000;
  Result<std::unique_ptr<Transport>> t = CreateTransport("tcp", options);
  ASSERT_TRUE(t.ok());
  Link link;
  ASSERT_TRUE(MakeLink(LinkKind::kSocketPair, &link).ok());
  UniqueFd src(::open((dir + "/src").c_str(), O_RDONLY | O_CLOEXEC));
  UniqueFd sink(::open((dir + "/dst").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
  ASSERT_TRUE(src.valid() && sink.valid());
  FileSource fs;
  fs.fd = src.get();
  fs.size = size;
  fs.path = dir + "/src";
  Status push_status;
  std::thread owner([&] { push_status = (*t)->PushNow(*link.owner, fs, "", nullptr); });
  TransferStats stats;
  Status pull_status = (*t)->PullNow(*link.requester, size, "", sink.get(), &stats);
  owner.join();
  ASSERT_TRUE(push_status.ok()) << push_status.ToString();
  ASSERT_TRUE(pull_status.ok()) << pull_status.ToString();
  EXPECT_EQ(stats.bytes, size);
  EXPECT_TRUE(SameContent(dir + "/src", dir + "/dst"));
  EXPECT_FALSE(link.requester->broken());
  RemoveTree(dir);
}

// The owner names the file by its root, the path beneath it and its inode
// (issue 12: a path string reopened by name could be swapped for a symlink).
std::string LocalArgs(const std::string& root, const std::string& upath, const std::string& real) {
  struct stat st {};
  ::stat(real.c_str(), &st);
  Encoder e;
  e.Str(root).Str(upath).U64(st.st_dev).U64(st.st_ino);
  return e.data();
}

TEST(LocalTransportPull, RefusesSymlinksAndNonFiles) {
  const std::string dir = MakeTempDir(BaseTempDir(), "local");
  ASSERT_FALSE(dir.empty());
  ASSERT_TRUE(WriteRandomFile(dir + "/real", 100, 10).ok());
  ASSERT_EQ(::symlink((dir + "/real").c_str(), (dir + "/link").c_str()), 0);
  ASSERT_EQ(::mkdir((dir + "/sub").c_str(), 0755), 0);
  LocalTransport t{TransportOptions()};
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  Channel session{UniqueFd(sv[0]), Trust::kAuthenticated};
  UniqueFd other(sv[1]);
  UniqueFd sink(::open((dir + "/sink").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
  const std::string real = dir + "/real";
  EXPECT_FALSE(t.PullNow(session, 100, LocalArgs(dir, "link", real), sink.get(), nullptr).ok());
  EXPECT_FALSE(
      t.PullNow(session, 100, LocalArgs(dir, "sub", dir + "/sub"), sink.get(), nullptr).ok());
  EXPECT_EQ(t.PullNow(session, 100, "relative/path", sink.get(), nullptr).code(),
            DYAD_RC_BADUNPACK);
  EXPECT_EQ(t.PullNow(session, 101, LocalArgs(dir, "real", real), sink.get(), nullptr).code(),
            DYAD_RC_BADFIO);
  EXPECT_EQ(
      t.PullNow(session, 100, LocalArgs(dir, "real", dir + "/sub"), sink.get(), nullptr).code(),
      DYAD_RC_STALE);
  EXPECT_TRUE(t.PullNow(session, 100, LocalArgs(dir, "real", real), sink.get(), nullptr).ok());
  RemoveTree(dir);
}

// The local transport's pull copies the owner's file (on the runtime's
// pool); its push has nothing to send; refused arguments are an error.
TEST(LocalTransportPull, LandsTheBytesAndRefusesGarbage) {
  ScopedTempDir dir("local-op");
  ASSERT_FALSE(dir.path.empty());
  const uint64_t size = 3 * kMiB + 5;
  ASSERT_TRUE(WriteRandomFile(dir.path + "/real", size, 21).ok());
  LocalTransport t{TransportOptions()};
  Link link;
  ASSERT_TRUE(MakeLink(LinkKind::kSocketPair, &link).ok());
  UniqueFd sink(::open((dir.path + "/sink").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
  ASSERT_TRUE(sink.valid());

  FileSource src;
  src.size = size;
  TransferStats pushed;
  pushed.bytes = 99;  // reset by the push
  EXPECT_TRUE(t.PushNow(*link.owner, src, "", &pushed).ok());
  EXPECT_EQ(pushed.bytes, 0u);

  TransferStats stats;
  const Status st = t.PullNow(*link.requester, size,
                              LocalArgs(dir.path, "real", dir.path + "/real"), sink.get(), &stats);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(stats.bytes, size);
  EXPECT_TRUE(SameContent(dir.path + "/real", dir.path + "/sink"));
  EXPECT_FALSE(link.requester->broken());
  EXPECT_EQ(t.PullNow(*link.requester, size, "garbage", sink.get(), &stats).code(),
            DYAD_RC_BADUNPACK);
}

// Every transport: an empty file needs no bytes and no peer (local still
// checks the owner's arguments, here none); a pull with no sink is refused
// at once; neither waits for its idle bound.
TEST(TransportTransfers, EmptyFilesAndMissingSinksEndAtOnce) {
  for (const std::string& name : TransportNames()) {
    SCOPED_TRACE(name);
    TransportOptions options;
    options.idle_ms = 5000;
    Result<std::unique_ptr<Transport>> t = CreateTransport(name, options);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    Link link;
    ASSERT_TRUE(MakeLink(LinkKind::kSocketPair, &link).ok());
    const auto t0 = std::chrono::steady_clock::now();
    TransferStats stats;
    const Status empty = (*t)->PullNow(*link.requester, 0, "", -1, &stats);
    if (name == "local")
      EXPECT_EQ(empty.code(), DYAD_RC_BADUNPACK) << empty.ToString();
    else
      EXPECT_TRUE(empty.ok()) << empty.ToString();
    EXPECT_FALSE((*t)->PullNow(*link.requester, 100, "", -1, &stats).ok());
    EXPECT_LT(Seconds(std::chrono::steady_clock::now() - t0), 2.0);
  }
}

// CPU time of this process, for "it sleeps, it does not spin".
double ProcessCpuSeconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

// A peer that never sends fails the pull at idle_ms with DYAD_RC_TIMEOUT
// naming the bound, breaking the session; a requester that takes nothing
// fails the push the same way. Meanwhile the transfer sleeps: a spinning
// wait would burn the whole bound in CPU time.
TEST(TransferWaits, NoProgressWithinIdleMsIsATimeoutNamingTheBound) {
  TransportOptions options;
  options.idle_ms = 300;
  for (const bool pull : {true, false}) {
    SCOPED_TRACE(pull ? "pull" : "push");
    Result<std::unique_ptr<Transport>> t = CreateTransport("tcp", options);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    Link link;
    ASSERT_TRUE(MakeLink(LinkKind::kSocketPair, &link).ok());
    ScopedTempDir dir("idle");
    ASSERT_FALSE(dir.path.empty());
    const uint64_t size = 32 * kMiB;  // far more than the socket buffers hold
    ASSERT_TRUE(WriteRandomFile(dir.path + "/f", size, 3).ok());
    UniqueFd file(::open((dir.path + "/f").c_str(), O_RDWR | O_CLOEXEC));
    ASSERT_TRUE(file.valid());
    FileSource src;
    src.fd = file.get();
    src.size = size;
    src.path = dir.path + "/f";
    const double cpu0 = ProcessCpuSeconds();
    const auto t0 = std::chrono::steady_clock::now();
    const Status st = pull ? (*t)->PullNow(*link.requester, size, "", file.get(), nullptr)
                           : (*t)->PushNow(*link.owner, src, "", nullptr);
    const double waited = Seconds(std::chrono::steady_clock::now() - t0);
    EXPECT_EQ(st.code(), DYAD_RC_TIMEOUT) << st.ToString();
    EXPECT_NE(st.message().find("300 ms"), std::string::npos) << st.ToString();
    EXPECT_TRUE((pull ? link.requester : link.owner)->broken());
    EXPECT_GE(waited, 0.29);
    EXPECT_LT(waited, 1.5);
    EXPECT_LT(ProcessCpuSeconds() - cpu0, 0.2) << "the wait spun";
  }
}

// Progress restarts the idle bound: a slow peer that keeps sending
// outlives idle_ms several times over.
TEST(TransferWaits, ProgressRestartsTheIdleBound) {
  TransportOptions options;
  options.idle_ms = 300;
  TcpTransport t(options);
  Link link;
  ASSERT_TRUE(MakeLink(LinkKind::kSocketPair, &link).ok());
  ScopedTempDir dir("slow");
  ASSERT_FALSE(dir.path.empty());
  UniqueFd sink(::open((dir.path + "/sink").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
  ASSERT_TRUE(sink.valid());
  constexpr int kBytes = 8;
  std::atomic<bool> stop{false};
  std::thread peer([&] {
    for (int i = 0; i < kBytes && !stop; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(150));
      (void)!::send(link.owner->fd(), "x", 1, MSG_NOSIGNAL);
    }
  });
  const auto t0 = std::chrono::steady_clock::now();
  const Status st = t.PullNow(*link.requester, kBytes, "", sink.get(), nullptr);
  const double took = Seconds(std::chrono::steady_clock::now() - t0);
  stop = true;
  peer.join();
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_GE(took, 1.0);  // 8 x 150 ms: well past the 300 ms bound
}

// The operation's Stop (its requester hung up, the service stops) ends a
// transfer waiting on a silent peer at once, with the Stop's reason, long
// before its idle bound, and breaks the session.
TEST(TransferWaits, TheOperationsStopEndsATransferAtOnce) {
  TransportOptions options;
  options.idle_ms = 60000;
  for (const std::string& name : TransportNames()) {
    // local never waits on the peer; ofi's pull needs the owner's keys
    // first (its Stop: transport_ofi_op_test.cc).
    if (name == "local" || name == "ofi") continue;
    SCOPED_TRACE(name);
    Result<std::unique_ptr<Transport>> t = CreateTransport(name, options);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    Link link;
    ASSERT_TRUE(MakeLink(LinkKind::kSocketPair, &link).ok());
    ScopedTempDir dir("stop");
    ASSERT_FALSE(dir.path.empty());
    UniqueFd sink(::open((dir.path + "/sink").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
    ASSERT_TRUE(sink.valid());
    Runtime rt(2, 1000);
    ASSERT_TRUE(rt.Start().ok());
    Stop stop(rt.executor(), &rt.stopping());
    TransferWaits waits(rt, &stop);
    std::thread hang_up([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      stop.Fire(Status(DYAD_RC_CANCELLED, "the requester hung up"));
    });
    const auto t0 = std::chrono::steady_clock::now();
    TransferStats stats;
    const Status st = rt.RunSync([&]() -> Task<Status> {
      Status s = co_await (*t)->Pull(*link.requester, 8 * kMiB, "", sink.get(), &stats, waits);
      link.requester->attachment().reset();
      co_return s;
    }());
    const double took = Seconds(std::chrono::steady_clock::now() - t0);
    hang_up.join();
    rt.Shutdown();
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("the requester hung up"), std::string::npos) << st.ToString();
    EXPECT_TRUE(link.requester->broken());
    EXPECT_LT(took, 5.0);
  }
}

// A stall counts as parked once, however many waits it takes: a transport
// that looks again every slice (UCX, OFI) waits in many; data from the
// peer ends the stall, and the next one counts again.
TEST(TransferWaits, AStallCountsAsParkedOnceThoughItsWaitsComeInSlices) {
  struct Counting : TransferWaits {
    using TransferWaits::TransferWaits;
    void Parked() override { ++parks; }
    int parks = 0;
  };
  Link link;
  ASSERT_TRUE(MakeLink(LinkKind::kSocketPair, &link).ok());
  Runtime rt(1, 1000);
  ASSERT_TRUE(rt.Start().ok());
  Counting waits(rt, &rt.stopping());
  const IdleBound idle(5000);
  // 8 slices of 60 ms: 480 ms of silence, several park budgets (100 ms).
  auto stall = [&]() -> Task<Status> {
    for (int i = 0; i < 8; ++i) {
      Status st = co_await waits.ForPeer(*link.requester, idle, "silent", -1, 60);
      if (!st.ok()) co_return st;
    }
    co_return Status::OK();
  };
  ASSERT_TRUE(rt.RunSync(stall()).ok());
  EXPECT_EQ(waits.parks, 1);
  // The peer speaks: the stall is over; the next silence is a new one.
  ASSERT_EQ(::send(link.owner->fd(), "x", 1, MSG_NOSIGNAL), 1);
  ASSERT_TRUE(rt.RunSync(waits.ForPeer(*link.requester, idle, "silent")).ok());
  char c = 0;
  ASSERT_EQ(::recv(link.requester->fd(), &c, 1, 0), 1);
  ASSERT_TRUE(rt.RunSync(stall()).ok());
  EXPECT_EQ(waits.parks, 2);
  link.requester->attachment().reset();
  rt.Shutdown();
}

#ifdef DYAD_HAVE_UCX
// ---------------------------------------------------------------------------
// ucx specifics: capabilities, many pipelined chunks, separate workers.
// (Its registered memory and pools: transport_ucx_pool_test.cc.)

TEST(UcxTransport, ReportsMessagingCaps) {
  Result<std::unique_ptr<Transport>> t = CreateTransport("UCX", TransportOptions());
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  // Chunks travel as tagged messages into registered memory, not as puts.
  EXPECT_FALSE((*t)->caps().rma_put);
  EXPECT_TRUE((*t)->caps().needs_registration);
  EXPECT_FALSE((*t)->caps().same_node_only);
}

// Owner and requester on separate workers (as on two nodes), with small
// chunks so one file takes many message / credit rounds through every
// slot. A requester that restarts has a new worker address; the owner's
// endpoint cache must treat it as a new peer.
TEST(UcxTransport, PipelinedChunksAcrossWorkersAndARestartedRequester) {
  const ScopedTempDir tmp("ucx");
  const std::string& dir = tmp.path;
  ASSERT_FALSE(dir.empty());
  ASSERT_EQ(::mkdir((dir + "/src").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((dir + "/dst").c_str(), 0755), 0);
  // 33 messages of 32 KiB (a 64 KiB chunk size makes a 128 KiB buffer of 4
  // slots), the last of 7 bytes.
  const uint64_t size = kMiB + 7;
  ASSERT_TRUE(WriteRandomFile(dir + "/src/f", size, 21).ok());
  TransportOptions options;
  options.chunk_size = 64 * kKiB;
  options.idle_ms = 5000;
  Result<std::unique_ptr<Transport>> owner_t = CreateTransport("ucx", options);
  ASSERT_TRUE(owner_t.ok()) << owner_t.status().ToString();
  Link link;
  ASSERT_TRUE(MakeLink(LinkKind::kSocketPair, &link).ok());
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE("requester incarnation " + std::to_string(round));
    Result<std::unique_ptr<Transport>> req_t = CreateTransport("ucx", options);
    ASSERT_TRUE(req_t.ok()) << req_t.status().ToString();
    OwnerResult served;
    std::thread owner([&] { served = ServeFetch(**owner_t, *link.owner, dir + "/src"); });
    PullResult pulled = Fetch(**req_t, *link.requester, "f", dir + "/dst");
    owner.join();
    ASSERT_TRUE(served.st.ok()) << served.st.ToString();
    ASSERT_TRUE(pulled.st.ok()) << pulled.st.ToString();
    EXPECT_EQ(pulled.stats.bytes, size);
    EXPECT_EQ(pulled.stats.chunks, 33u);
    EXPECT_EQ(served.stats.bytes, size);
    EXPECT_EQ(served.stats.chunks, 33u);
    EXPECT_TRUE(SameContent(dir + "/src/f", dir + "/dst/f"));
    EXPECT_FALSE(link.owner->broken());
    EXPECT_FALSE(link.requester->broken());
    ASSERT_EQ(::unlink((dir + "/dst/f").c_str()), 0);
  }
}

// Concurrent transfers on separate sessions share one owner transport and
// one requester transport: one cached endpoint, both pools (with more
// transfers than pool buffers, so some wait for a buffer), one worker each.
TEST(UcxTransport, ConcurrentTransfersShareEndpointAndPools) {
  const ScopedTempDir tmp("ucx-conc");
  const std::string& dir = tmp.path;
  ASSERT_FALSE(dir.empty());
  ASSERT_EQ(::mkdir((dir + "/src").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((dir + "/dst").c_str(), 0755), 0);
  constexpr int kTransfers = 6;  // > kDefaultPoolBuffers
  for (int i = 0; i < kTransfers; ++i)
    ASSERT_TRUE(WriteRandomFile(dir + "/src/f" + std::to_string(i), 3 * kMiB + i, 30 + i).ok());
  TransportOptions options;
  options.chunk_size = 256 * kKiB;
  options.idle_ms = 10000;
  Result<std::unique_ptr<Transport>> owner_t = CreateTransport("ucx", options);
  Result<std::unique_ptr<Transport>> req_t = CreateTransport("ucx", options);
  ASSERT_TRUE(owner_t.ok() && req_t.ok());
  std::vector<Link> links(kTransfers);
  for (Link& l : links) ASSERT_TRUE(MakeLink(LinkKind::kSocketPair, &l).ok());
  std::vector<OwnerResult> served(kTransfers);
  std::vector<PullResult> pulled(kTransfers);
  std::vector<std::thread> threads;
  for (int i = 0; i < kTransfers; ++i) {
    threads.emplace_back(
        [&, i] { served[i] = ServeFetch(**owner_t, *links[i].owner, dir + "/src"); });
    threads.emplace_back([&, i] {
      pulled[i] = Fetch(**req_t, *links[i].requester, "f" + std::to_string(i), dir + "/dst");
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kTransfers; ++i) {
    const std::string name = "f" + std::to_string(i);
    EXPECT_TRUE(served[i].st.ok()) << name << ": " << served[i].st.ToString();
    EXPECT_TRUE(pulled[i].st.ok()) << name << ": " << pulled[i].st.ToString();
    EXPECT_TRUE(SameContent(dir + "/src/" + name, dir + "/dst/" + name)) << name;
  }
}

// Sets an environment variable for one scope (UCX reads UCX_TLS when a
// transport first starts, which PrepareRequest forces).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_)
      ::setenv(name_.c_str(), old_.c_str(), 1);
    else
      ::unsetenv(name_.c_str());
  }

 private:
  std::string name_, old_;
  bool had_ = false;
};

// A started ucx transport (its UCX context read the environment as it is).
std::unique_ptr<Transport> StartedUcx(const TransportOptions& options) {
  Result<std::unique_ptr<Transport>> t = CreateTransport("ucx", options);
  if (!t.ok() || !(*t)->PrepareRequest().ok()) return nullptr;
  return std::move(*t);
}

// Owner and requester on one host with shared memory: the owner writes the
// chunks straight into the requester's registered (shared) buffer, every
// byte counts as direct on both sides, through all slots and a requester
// restart; with DYAD_UCX_SHM=off the same transfer moves as UCX messages;
// and a requester whose UCX has no shared memory (its buffers cannot be
// mapped) gets messages from the same owner.
TEST(UcxTransport, SameHostRequesterBufferIsWrittenDirectly) {
  const ScopedTempDir tmp("ucx-shm");
  const std::string& dir = tmp.path;
  ASSERT_FALSE(dir.empty());
  ASSERT_EQ(::mkdir((dir + "/src").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((dir + "/dst").c_str(), 0755), 0);
  const uint64_t size = 3 * kMiB + 7;  // 97 chunks of 32 KiB
  ASSERT_TRUE(WriteRandomFile(dir + "/src/f", size, 23).ok());
  TransportOptions options;
  options.chunk_size = 64 * kKiB;
  options.idle_ms = 5000;
  auto transfer = [&](Transport& owner_t, Transport& req_t, uint64_t want_direct) {
    Link link;
    ASSERT_TRUE(MakeLink(LinkKind::kSocketPair, &link).ok());
    OwnerResult served;
    std::thread owner([&] { served = ServeFetch(owner_t, *link.owner, dir + "/src"); });
    PullResult pulled = Fetch(req_t, *link.requester, "f", dir + "/dst");
    owner.join();
    ASSERT_TRUE(served.st.ok()) << served.st.ToString();
    ASSERT_TRUE(pulled.st.ok()) << pulled.st.ToString();
    EXPECT_EQ(pulled.stats.bytes, size);
    EXPECT_EQ(served.stats.bytes, size);
    EXPECT_EQ(pulled.stats.direct_bytes, want_direct);
    EXPECT_EQ(served.stats.direct_bytes, want_direct);
    EXPECT_TRUE(SameContent(dir + "/src/f", dir + "/dst/f"));
    EXPECT_FALSE(link.requester->broken());
    ASSERT_EQ(::unlink((dir + "/dst/f").c_str()), 0);
  };
  {
    ScopedEnv tls("UCX_TLS", "shm,tcp");
    std::unique_ptr<Transport> owner_t = StartedUcx(options);
    ASSERT_NE(owner_t, nullptr);
    for (int round = 0; round < 2; ++round) {
      SCOPED_TRACE("requester incarnation " + std::to_string(round));
      std::unique_ptr<Transport> req_t = StartedUcx(options);
      ASSERT_NE(req_t, nullptr);
      ASSERT_NO_FATAL_FAILURE(transfer(*owner_t, *req_t, size));
    }
    {
      SCOPED_TRACE("DYAD_UCX_SHM=off");
      ScopedEnv off("DYAD_UCX_SHM", "off");
      std::unique_ptr<Transport> req_t = StartedUcx(options);
      ASSERT_NE(req_t, nullptr);
      ASSERT_NO_FATAL_FAILURE(transfer(*owner_t, *req_t, 0));
    }
    SCOPED_TRACE("requester without shared memory");
    std::unique_ptr<Transport> req_t;
    {
      ScopedEnv tcp_only("UCX_TLS", "tcp");
      req_t = StartedUcx(options);
    }
    ASSERT_NE(req_t, nullptr);
    ASSERT_NO_FATAL_FAILURE(transfer(*owner_t, *req_t, 0));
  }
}

// Bad transport arguments are refused by the owner, which tells the
// requester; neither side waits for its idle bound.
TEST(UcxTransport, GarbageRequestArgumentsFailBothSidesPromptly) {
  TransportOptions options;
  options.idle_ms = 5000;
  Result<std::unique_ptr<Transport>> t = CreateTransport("ucx", options);
  ASSERT_TRUE(t.ok());
  const ScopedTempDir tmp("ucx-bad");
  const std::string& dir = tmp.path;
  ASSERT_FALSE(dir.empty());
  // Larger than kInlineMaxBytes, so the owner needs the UCX arguments.
  const uint64_t size = 200 * kKiB;
  ASSERT_TRUE(WriteRandomFile(dir + "/src", size, 22).ok());
  UniqueFd src(::open((dir + "/src").c_str(), O_RDONLY | O_CLOEXEC));
  UniqueFd sink(::open((dir + "/dst").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
  ASSERT_TRUE(src.valid() && sink.valid());
  Link link;
  ASSERT_TRUE(MakeLink(LinkKind::kSocketPair, &link).ok());
  FileSource fs;
  fs.fd = src.get();
  fs.size = size;
  fs.path = dir + "/src";
  const auto t0 = std::chrono::steady_clock::now();
  Status push_status;
  std::thread owner([&] { push_status = (*t)->PushNow(*link.owner, fs, "not ucx args", nullptr); });
  Status pull_status = (*t)->PullNow(*link.requester, size, "", sink.get(), nullptr);
  owner.join();
  EXPECT_LT(Seconds(std::chrono::steady_clock::now() - t0), 2.0);
  EXPECT_EQ(push_status.code(), DYAD_RC_BADREQUEST) << push_status.ToString();
  EXPECT_FALSE(pull_status.ok());
  EXPECT_TRUE(link.owner->broken());
  EXPECT_TRUE(link.requester->broken());
}
#endif  // DYAD_HAVE_UCX

}  // namespace
}  // namespace dyad
