// ops_util.h: what the operations tests add to TwoNodeTest: extra
// dyad-service processes started by hand on a node (a second claimant of a
// rank, a service pointed at an absent root, one with another host name),
// the `dyad` command run on a node, and bounded waits on log files.
//
// Threading: the gtest main thread only.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "integration/integration_util.h"

namespace dyad::it {

inline void WriteText(const std::string& path, const std::string& text, mode_t mode = 0644) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode));
  ASSERT_TRUE(fd.valid()) << path;
  ASSERT_TRUE(WriteFully(fd.get(), text.data(), text.size()).ok());
}

// Waits until `path` contains `text` (bounded); false on timeout.
inline bool WaitForText(const std::string& path, const std::string& text, int64_t timeout_ms) {
  return Eventually([&] { return ReadText(path).find(text) != std::string::npos; }, timeout_ms, 20);
}

class OpsTest : public TwoNodeTest {
 protected:
  // A service started by hand: its directories, and its process.
  struct ExtraService {
    std::string dir, dmd, socket, log, ready;
    emu::Process process;
  };

  // Directories for a hand-started service on `node` (not started yet).
  ExtraService NewExtra(const std::string& name) {
    ExtraService s;
    s.dir = cluster().base_dir() + "/" + name;
    s.dmd = s.dir + "/dmd";
    s.socket = s.dir + "/service.sock";
    s.log = s.dir + "/service.log";
    s.ready = s.dir + "/ready";
    // The service's socket lives here: it refuses a directory others can enter.
    EXPECT_EQ(::mkdir(s.dir.c_str(), 0700), 0);
    EXPECT_EQ(::mkdir(s.dmd.c_str(), 0755), 0);
    return s;
  }

  std::string ServiceBinary() {
    return emu::FindSiblingProgram("dyad-service", DYAD_BUILD_BIN_DIR);
  }

  std::string RootStore() { return "embedded://" + cluster().node(kA).address(); }

  // dyad-service arguments for `s` with rank, listen address and store;
  // logs (-i/-e) and captured output both go to s.log.
  std::vector<std::string> ServiceArgv(const ExtraService& s, uint32_t rank,
                                       const std::string& listen, const std::string& kvs,
                                       const std::vector<std::string>& extra = {}) {
    std::vector<std::string> a = {ServiceBinary(),
                                  "-r",
                                  std::to_string(rank),
                                  "-l",
                                  listen,
                                  "-s",
                                  s.socket,
                                  "-k",
                                  kvs,
                                  "-i",
                                  s.log,
                                  "-e",
                                  s.log,
                                  "--ready-file",
                                  s.ready,
                                  "--secret-file",
                                  cluster().secret_file()};
    a.insert(a.end(), extra.begin(), extra.end());
    a.push_back(s.dmd);
    return a;
  }

  // Starts `argv` in node `node`'s network; output appended to s.log.
  void Start(int node, ExtraService& s, const std::vector<std::string>& argv) {
    emu::SpawnOptions o;
    o.argv = argv;
    o.netns = cluster().node(node).netns;
    o.stdout_path = s.log;
    o.stderr_path = s.log;
    auto p = emu::Process::Spawn(o);
    ASSERT_TRUE(p.ok()) << Str(p.status());
    s.process = std::move(*p);
  }

  bool WaitReady(ExtraService& s, int64_t timeout_ms = 15000) {
    const Deadline deadline = Deadline::AfterMs(timeout_ms);
    while (!Exists(s.ready)) {
      if (s.process.Exited() || deadline.expired()) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return true;
  }

  // `dyad ARGS...` on `node` with the node's client environment.
  emu::RunResult Dyad(int node, const std::vector<std::string>& args, const Env& env = {},
                      int64_t timeout_ms = 30000) {
    std::vector<std::string> argv = {dyad_};
    argv.insert(argv.end(), args.begin(), args.end());
    auto r = cluster().RunOnNode(node, argv, timeout_ms, env);
    EXPECT_TRUE(r.ok()) << Str(r.status());
    return r.ok() ? *r : emu::RunResult{};
  }
};

}  // namespace dyad::it
