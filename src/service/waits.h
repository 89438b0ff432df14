// waits.h: the local requests waiting for a publication, for `dyad status`.
//
// A consume (or waiting locate) of a file nobody has published yet is
// parked (service_parking.cc) and costs no thread, which also made it
// invisible: a reader hung on a file that exists on its node but was never
// published (written by a shell redirection, outside DYAD) looked like one
// anonymous "requests.parked". Each parked wait is registered here with
// what an operator needs: the file, the namespace, the client's pid and
// the age; Snapshot() adds whether a file by that name exists on this node
// unpublished, and LongWaits() hands out each wait once when it passes a
// threshold, for the service's info log.
// Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "proto/protocol.h"

namespace dyad {

class WaitRegistry {
 public:
  // `dirs`: where a file by the waited name would sit on this node (the
  // producer directory); a consume's own consumer directory is added.
  explicit WaitRegistry(std::vector<std::string> dirs = {}) : dirs_(std::move(dirs)) {}

  struct Wait {
    std::string kind;  // "consume" or "locate"
    std::string ns;
    std::string upath;      // a locate: its key
    std::string cons_path;  // a consume's consumer directory ("": none)
    uint32_t pid = 0;
  };
  // Registers `w`; returns its id for Remove.
  uint64_t Add(Wait w);
  void Remove(uint64_t id);
  size_t size() const;

  // Every wait, oldest first, with the file found locally if any.
  std::vector<WaitInfo> Snapshot() const;
  // Waits older than `min_age_ns` not handed out before (each once).
  std::vector<WaitInfo> LongWaits(uint64_t min_age_ns);

  // A regular file named `upath` under `cons_path` or one of the
  // registry's directories ("" when none).
  std::string LocalFile(const std::string& cons_path, const std::string& upath) const;

 private:
  struct Entry {
    Wait w;
    uint64_t start_ns = 0;          // monotonic
    mutable bool reported = false;  // by LongWaits
  };
  WaitInfo InfoOf(const Entry& e, uint64_t now) const;
  // The waits at least `min_age_ns` old (with `once`, those not collected
  // with `once` before, marking them), oldest first, each with its local file.
  std::vector<WaitInfo> Collect(uint64_t min_age_ns, bool once) const;

  const std::vector<std::string> dirs_;
  mutable std::mutex mu_;
  uint64_t next_id_ = 1;
  std::map<uint64_t, Entry> waits_;  // by id: oldest first
};

}  // namespace dyad
