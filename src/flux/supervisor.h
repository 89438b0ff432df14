// supervisor.h: the module's dyad-service, a supervised child of the broker.
//
// The service runs through the broker's subprocess server (flux_rexec to the
// module's own rank), never inside the broker, so a crash of the service
// never takes the broker down. The supervisor owns a second connection to
// the broker (its local-uri) with its own reactor on its own thread: the
// module's handle must not run its reactor before the service is ready,
// because entering that reactor is what makes `flux module load` return.
//
// The child's stdout and stderr go to `flux dmesg` line by line (flux_log,
// the level taken from the service's line). A child that ends after it was
// ready is restarted with back-off (1, 2, 4, 8, 16 s; at most 5 times in a
// row, a run of a minute resets the count), each step logged; one that ends
// before it was ready fails the load with its exit status and last lines.
#pragma once

#include <sys/types.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"

namespace dyad {

class Supervisor {
 public:
  struct Config {
    std::string uri;                // the broker's local-uri
    uint32_t rank = 0;              // the broker's rank (the child runs there)
    std::vector<std::string> argv;  // dyad-service and its arguments
    std::vector<std::pair<std::string, std::string>> env;  // set on top of the broker's
    std::string ready_file;                                // the service's --ready-file
    double stop_grace_s = 5;                               // SIGTERM, then SIGKILL after this
    int max_restarts = 5;                                  // in a row
  };

  // What `flux module stats dyad` shows of the child.
  struct Snapshot {
    std::string state;  // starting, running, restarting, stopping, stopped, failed
    pid_t pid = 0;
    uint64_t starts = 0;
    uint64_t restarts = 0;
    uint64_t exits = 0;
    std::string last_exit;  // "exit 1", "signal 9 (Killed)", ""
    double up_since = 0;    // unix time of the last ready, 0 when down
  };

  explicit Supervisor(Config config);
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Starts the thread and the child, and waits at most `timeout_s` for the
  // child's ready file. Errors name what happened (exit status and last
  // output lines, or the timeout).
  Status Start(double timeout_s);
  // SIGTERM to the child, SIGKILL after stop_grace_s, then joins the thread
  // (bounded: at most stop_grace_s + 3 s).
  void Stop();
  Snapshot Get();

  // Implementation (called from libflux callbacks on the supervisor thread).
  struct Impl;

 private:
  Impl* impl_;
};

}  // namespace dyad
