// dyad-transfer: large-file throughput between two emulated nodes, DYAD
// against the raw TCP it runs on.
//
// In one run and over the same link (a veth pair between two network
// namespaces as root, loopback otherwise) it measures, per repetition:
//   raw-mem   a plain sender on node A streams N bytes from memory to a plain
//             receiver on node B that discards them (the wire's ceiling);
//   raw-file  the sender sendfile()s a file from A's directory, the
//             receiver write()s it into B's directory (the ceiling for any
//             file mover that does not skip the page cache);
//   dyad      a producer on A writes and publishes a file, a consumer on B
//             calls dyad_consume; the time of that call.
// and prints medians and the ratios DYAD / raw. A figure printer, never a
// pass/fail test. The plain sender and receiver are hidden modes of this
// program (--role send|recv), run inside the nodes.
#include <fcntl.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/net.h"
#include "common/time.h"
#include "emu/cluster.h"
#include "emu/netns.h"
#include "emu/pattern.h"
#include "emu/worker.h"

#ifndef DYAD_BUILD_BIN_DIR
#define DYAD_BUILD_BIN_DIR ""
#endif

namespace dyad::bench {
namespace {

constexpr size_t kBuf = 4u << 20;
constexpr uint64_t kMiB = 1ull << 20;

struct Args {
  std::string role;
  std::string addr;  // recv: listen address (port 0 picks one); send: peer
  std::string file;
  std::string ready;
  std::string result;
  uint64_t bytes = 0;
  // Driver.
  uint64_t size = 1024 * kMiB;
  int reps = 3;
  bool json = false;
  std::string mode;
  bool loopback = false;
  std::string tmp;
};

void Usage() {
  std::printf(
      "usage: dyad-transfer [--size BYTES | --size-mib N] [--reps N] [--mode MODE] [--loopback]\n"
      "                     [--tmp DIR] [--json]\n"
      "Measures raw TCP (memory and file-to-file) and DYAD consume throughput between two\n"
      "emulated nodes, side by side. Default: 1 GiB, 3 repetitions. --tmp puts the node\n"
      "directories under DIR (e.g. /dev/shm for tmpfs node-local storage).\n");
}

bool ParseU64(const char* s, uint64_t* out) {
  if (!s || !*s || *s == '-') return false;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s, &end, 10);
  if (*end) return false;
  *out = v;
  return true;
}

Status WriteText(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd.valid()) return StatusFromErrno(errno, "create '" + tmp + "'");
  DYAD_RETURN_IF_ERROR(WriteFully(fd.get(), text.data(), text.size()));
  if (::rename(tmp.c_str(), path.c_str()) != 0)
    return StatusFromErrno(errno, "rename '" + tmp + "'");
  return Status::OK();
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return s;
}

// --- roles -----------------------------------------------------------------

int Receive(const Args& a) {
  auto addr = ParseAddress(a.addr);
  if (!addr.ok()) return 2;
  auto lfd = Listen(*addr, 4);
  if (!lfd.ok()) {
    std::fprintf(stderr, "recv: %s\n", lfd.status().ToString().c_str());
    return 2;
  }
  auto bound = BoundAddress(lfd->get());
  if (!bound.ok() || !WriteText(a.ready, bound->ToString() + "\n").ok()) return 2;
  auto cfd = Accept(lfd->get(), Deadline::AfterMs(60000));
  if (!cfd.ok()) {
    std::fprintf(stderr, "recv: %s\n", cfd.status().ToString().c_str());
    return 2;
  }
  Channel ch(std::move(*cfd));
  UniqueFd out;
  if (!a.file.empty()) {
    out.reset(::open(a.file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!out.valid()) return 2;
  }
  std::unique_ptr<char[]> buf(new char[kBuf]);
  uint64_t got = 0;
  uint64_t t0 = 0;
  while (got < a.bytes) {
    auto n = ch.RecvSome(buf.get(), static_cast<size_t>(std::min<uint64_t>(kBuf, a.bytes - got)),
                         Deadline::AfterMs(60000));
    if (!n.ok()) {
      std::fprintf(stderr, "recv: %s after %llu bytes\n", n.status().ToString().c_str(),
                   static_cast<unsigned long long>(got));
      return 1;
    }
    if (t0 == 0) t0 = MonoNs();
    if (out.valid() && !WriteFully(out.get(), buf.get(), *n).ok()) return 1;
    got += *n;
  }
  if (out.valid() && ::close(out.release()) != 0) return 1;
  const uint64_t ns = MonoNs() - t0;
  // Tell the sender we are done, so its timing covers the whole stream too.
  const char done = 'k';
  (void)ch.SendAll(&done, 1, Deadline::AfterMs(5000));
  return WriteText(a.result, std::to_string(got) + " " + std::to_string(ns) + "\n").ok() ? 0 : 1;
}

int Send(const Args& a) {
  auto addr = ParseAddress(a.addr);
  if (!addr.ok()) return 2;
  auto fd = Connect(*addr, Deadline::AfterMs(10000));
  if (!fd.ok()) {
    std::fprintf(stderr, "send: %s\n", fd.status().ToString().c_str());
    return 2;
  }
  Channel ch(std::move(*fd));
  const uint64_t t0 = MonoNs();
  if (!a.file.empty()) {
    UniqueFd in(::open(a.file.c_str(), O_RDONLY | O_CLOEXEC));
    if (!in.valid()) return 2;
    Status st = ch.SendFileRange(in.get(), 0, a.bytes, 60000);
    if (!st.ok()) {
      std::fprintf(stderr, "send: %s\n", st.ToString().c_str());
      return 1;
    }
  } else {
    std::unique_ptr<char[]> buf(new char[kBuf]);
    emu::FillPattern(1, 0, buf.get(), kBuf);
    uint64_t sent = 0;
    while (sent < a.bytes) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(kBuf, a.bytes - sent));
      Status st = ch.SendAll(buf.get(), n, Deadline::AfterMs(60000));
      if (!st.ok()) {
        std::fprintf(stderr, "send: %s\n", st.ToString().c_str());
        return 1;
      }
      sent += n;
    }
  }
  char done = 0;
  if (!ch.RecvAll(&done, 1, Deadline::AfterMs(60000)).ok()) return 1;
  const uint64_t ns = MonoNs() - t0;
  if (!a.result.empty())
    (void)WriteText(a.result, std::to_string(a.bytes) + " " + std::to_string(ns) + "\n");
  return 0;
}

// --- driver ----------------------------------------------------------------

// Writes back the dirty pages of the file system holding `dir`.
void SyncFs(const std::string& dir) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.valid()) ::syncfs(fd.get());
}

std::string SelfExe() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "";
  buf[n] = '\0';
  return buf;
}

double MBps(uint64_t bytes, uint64_t ns) {
  return ns ? static_cast<double>(bytes) / 1e6 / (static_cast<double>(ns) / 1e9) : 0;
}

// One raw TCP run; returns MB/s measured by the receiver (0 on failure).
double RawRun(emu::EmuCluster& c, const std::string& dir, int rep, uint64_t bytes,
              const std::string& src_file, const std::string& dst_file) {
  const std::string self = SelfExe();
  const std::string stem = dir + "/raw" + std::to_string(rep) + (src_file.empty() ? "m" : "f");
  const std::string ready = stem + ".ready", result = stem + ".result";
  std::vector<std::string> rargv = {self,
                                    "--role",
                                    "recv",
                                    "--addr",
                                    c.node(1).ip + ":0",
                                    "--bytes",
                                    std::to_string(bytes),
                                    "--ready",
                                    ready,
                                    "--result",
                                    result};
  if (!dst_file.empty()) rargv.insert(rargv.end(), {"--file", dst_file});
  auto recv = c.SpawnOnNode(1, rargv, {}, stem + ".recv.out");
  if (!recv.ok()) return 0;
  const Deadline d = Deadline::AfterMs(10000);
  struct stat st;
  while (::stat(ready.c_str(), &st) != 0) {
    if (recv->Exited() || d.expired()) return 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::string addr = ReadText(ready);
  while (!addr.empty() && addr.back() == '\n') addr.pop_back();
  std::vector<std::string> sargv = {
      self, "--role", "send", "--addr", addr, "--bytes", std::to_string(bytes)};
  if (!src_file.empty()) sargv.insert(sargv.end(), {"--file", src_file});
  auto send = c.SpawnOnNode(0, sargv, {}, stem + ".send.out");
  if (!send.ok()) return 0;
  auto ss = send->Wait(Deadline::AfterMs(300000));
  auto rs = recv->Wait(Deadline::AfterMs(300000));
  if (!ss.ok() || !rs.ok() || !ss->success() || !rs->success()) {
    std::fprintf(stderr, "raw run failed; see %s.*.out\n", stem.c_str());
    return 0;
  }
  unsigned long long got = 0, ns = 0;
  if (std::sscanf(ReadText(result).c_str(), "%llu %llu", &got, &ns) != 2) return 0;
  return MBps(got, ns);
}

// Consumes `name` (already published on node A) on node B; MB/s of the
// dyad_consume call (0 on failure).
double DyadConsume(emu::EmuCluster& c, const std::string& dyad, const std::string& dir,
                   const std::string& name, uint64_t bytes, int rep) {
  const std::string manifest = dir + "/c" + std::to_string(rep) + ".m";
  if (!emu::WriteManifest(manifest, {{name, static_cast<int64_t>(bytes)}}).ok()) return 0;
  auto r = c.RunOnNode(1,
                       {dyad, "demo", "--role", "consume", "--manifest", manifest, "--result",
                        manifest + ".r", "--no-verify", "--no-metadata"},
                       600000);
  if (!r.ok() || !r->status.success()) {
    std::fprintf(stderr, "consumer failed: %s\n",
                 r.ok() ? r->output.c_str() : r.status().ToString().c_str());
    return 0;
  }
  auto cr = emu::ReadResults(manifest + ".r");
  if (!cr.ok() || cr->empty() || (*cr)[0].rc != 0) return 0;
  return MBps(bytes, (*cr)[0].call_ns);
}

int Drive(const Args& a) {
  emu::InstallSignalTeardown();
  const std::string dyad = emu::FindSiblingProgram("dyad", DYAD_BUILD_BIN_DIR);
  if (dyad.empty()) {
    std::fprintf(stderr, "dyad-transfer: the dyad command was not found\n");
    return 2;
  }
  emu::ClusterOptions o;
  o.bin_dir = DYAD_BUILD_BIN_DIR;
  o.mode = a.mode;
  o.use_netns = !a.loopback;
  o.tmp_parent = a.tmp;
  auto started = emu::EmuCluster::Start(2, o);
  if (!started.ok()) {
    std::fprintf(stderr, "dyad-transfer: %s\n", started.status().ToString().c_str());
    return 1;
  }
  emu::EmuCluster& c = **started;
  const std::string work = c.base_dir() + "/bench";
  ::mkdir(work.c_str(), 0755);
  const std::string link =
      c.uses_netns()
          ? "veth pair between network namespaces"
          : "loopback (" +
                (a.loopback ? std::string("--loopback") : emu::NetnsUnavailableReason()) + ")";
  if (!a.json) {
    std::printf("dyad-transfer: %s per run, %d repetitions, link: %s\n",
                emu::HumanBytes(a.size).c_str(), a.reps, link.c_str());
    std::fflush(stdout);
  }
  std::vector<double> mem, file, dy, pub;
  for (int rep = 0; rep < a.reps; ++rep) {
    const std::string name = "bench/rep" + std::to_string(rep) + ".bin";
    const std::string src = c.node(0).dmd + "/" + name;
    // Produce first: its file is also the raw file-to-file source, so both
    // senders read the same page-cached bytes.
    {
      const std::string manifest = work + "/p" + std::to_string(rep) + ".m";
      (void)emu::WriteManifest(manifest, {{name, static_cast<int64_t>(a.size)}});
      auto p = c.RunOnNode(
          0,
          {dyad, "demo", "--role", "produce", "--manifest", manifest, "--result", manifest + ".r"},
          600000);
      if (!p.ok() || !p->status.success()) {
        std::fprintf(stderr, "producer failed: %s\n",
                     p.ok() ? p->output.c_str() : p.status().ToString().c_str());
        return 1;
      }
      auto pr = emu::ReadResults(manifest + ".r");
      if (pr.ok() && !pr->empty()) pub.push_back(static_cast<double>((*pr)[0].call_ns) / 1e6);
    }
    // Each timed run starts with the page cache's dirty data written back,
    // and the order alternates between repetitions: otherwise whichever runs
    // second pays for the first one's writeback.
    const std::string dst = c.node(1).dmd + "/raw-copy.bin";
    auto run_mem = [&] {
      SyncFs(c.base_dir());
      mem.push_back(RawRun(c, work, rep, a.size, "", ""));
    };
    auto run_file = [&] {
      SyncFs(c.base_dir());
      file.push_back(RawRun(c, work, rep, a.size, src, dst));
      ::unlink(dst.c_str());
    };
    auto run_dyad = [&] {
      SyncFs(c.base_dir());
      dy.push_back(DyadConsume(c, dyad, work, name, a.size, rep));
      ::unlink((c.node(1).dmd + "/" + name).c_str());
    };
    if (rep % 2 == 0) {
      run_mem();
      run_file();
      run_dyad();
    } else {
      run_dyad();
      run_file();
      run_mem();
    }
    ::unlink(src.c_str());
    if (!a.json) {
      std::printf("  rep %d: raw-mem %8.1f MB/s   raw-file %8.1f MB/s   dyad %8.1f MB/s\n", rep + 1,
                  mem.back(), file.back(), dy.back());
      std::fflush(stdout);
    }
  }
  const double m_mem = emu::Median(mem), m_file = emu::Median(file), m_dy = emu::Median(dy);
  auto counters = c.ServiceStatus(1);
  if (a.json) {
    auto list = [](const std::vector<double>& v) {
      std::string s = "[";
      for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
      return s + "]";
    };
    std::printf(
        "{\"bench\": \"transfer\", \"bytes\": %llu, \"reps\": %d, \"link\": \"%s\",\n"
        " \"raw_mem_mbps\": %s, \"raw_file_mbps\": %s, \"dyad_mbps\": %s,\n"
        " \"median\": {\"raw_mem_mbps\": %.1f, \"raw_file_mbps\": %.1f, \"dyad_mbps\": %.1f},\n"
        " \"ratio_dyad_raw_mem\": %.3f, \"ratio_dyad_raw_file\": %.3f, \"publish_ms_median\": "
        "%.3f}\n",
        static_cast<unsigned long long>(a.size), a.reps, c.uses_netns() ? "veth" : "loopback",
        list(mem).c_str(), list(file).c_str(), list(dy).c_str(), m_mem, m_file, m_dy,
        m_mem > 0 ? m_dy / m_mem : 0.0, m_file > 0 ? m_dy / m_file : 0.0, emu::Median(pub));
  } else {
    std::printf("\nmedian of %d       MB/s\n", a.reps);
    std::printf("  raw TCP, memory      %8.1f\n", m_mem);
    std::printf("  raw TCP, file->file  %8.1f\n", m_file);
    std::printf("  DYAD consume         %8.1f\n", m_dy);
    std::printf("ratio DYAD / raw TCP (memory):       %.2f\n", m_mem > 0 ? m_dy / m_mem : 0.0);
    std::printf("ratio DYAD / raw TCP (file->file):   %.2f\n", m_file > 0 ? m_dy / m_file : 0.0);
    std::printf("publish (dyad_produce) median:       %.3f ms\n", emu::Median(pub));
    if (counters.ok())
      std::printf("node B service: transfers.in %llu, bytes.in %s\n",
                  static_cast<unsigned long long>(counters->counters["transfers.in"]),
                  emu::HumanBytes(counters->counters["bytes.in"]).c_str());
  }
  return 0;
}

int Main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    if (s == "-h" || s == "--help") {
      Usage();
      return 0;
    } else if (s == "--role") {
      const char* v = next();
      if (!v) return 2;
      a.role = v;
    } else if (s == "--addr") {
      const char* v = next();
      if (!v) return 2;
      a.addr = v;
    } else if (s == "--file") {
      const char* v = next();
      if (!v) return 2;
      a.file = v;
    } else if (s == "--ready") {
      const char* v = next();
      if (!v) return 2;
      a.ready = v;
    } else if (s == "--result") {
      const char* v = next();
      if (!v) return 2;
      a.result = v;
    } else if (s == "--bytes") {
      if (!ParseU64(next(), &a.bytes)) return 2;
    } else if (s == "--size") {
      if (!ParseU64(next(), &a.size) || a.size == 0) return 2;
    } else if (s == "--size-mib") {
      uint64_t mib = 0;
      if (!ParseU64(next(), &mib) || mib == 0) return 2;
      a.size = mib * kMiB;
    } else if (s == "--reps") {
      uint64_t r = 0;
      if (!ParseU64(next(), &r) || r == 0 || r > 100) return 2;
      a.reps = static_cast<int>(r);
    } else if (s == "--json") {
      a.json = true;
    } else if (s == "--loopback") {
      a.loopback = true;
    } else if (s == "--mode") {
      const char* v = next();
      if (!v) return 2;
      a.mode = v;
    } else if (s == "--tmp") {
      const char* v = next();
      if (!v) return 2;
      a.tmp = v;
    } else {
      std::fprintf(stderr, "dyad-transfer: unknown option '%s'\n", s.c_str());
      return 2;
    }
  }
  if (a.role == "recv") return Receive(a);
  if (a.role == "send") return Send(a);
  return Drive(a);
}

}  // namespace
}  // namespace dyad::bench

int main(int argc, char** argv) { return dyad::bench::Main(argc, argv); }
