// fd_watch.h: wakes a parked request when a descriptor becomes readable.
//
// A consume whose owner is slow or silent parks its request (router.h)
// instead of holding a worker while it waits for the owner's reply, file
// bytes or verdict (service/resumable.h). Something must then watch that
// session and resume the request when bytes arrive, its deadline passes,
// or the service stops: this is that something, one epoll thread for the
// whole service, so a thousand parked fetches cost one thread, not a
// thousand. It is separate from the reactor's loop on purpose: the loop
// owns the connections of requesters and its timers serve handshakes and
// write parks; the sessions watched here belong to the fetches (owned by
// their operation, closed by it), and their deadlines move with every
// step. One more thread keeps both loops short and their ownership plain.
//
// A watch fires exactly once (kReady, kTimeout or kStopped), on the
// watcher's thread, unless Cancel() took it first; callbacks must be short
// (they hand work to a worker: ParkedRequest::Resume). A watch of fd -1 is
// a plain timer (a joiner of another consume's transfer waits on it).
// Thread-safe.
#pragma once

#include <poll.h>

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "common/net.h"
#include "common/status.h"
#include "common/time.h"

namespace dyad {

class FdWatcher {
 public:
  enum class Event { kReady, kTimeout, kStopped };
  using Callback = std::function<void(Event)>;

  FdWatcher() = default;
  ~FdWatcher() { Stop(); }
  FdWatcher(const FdWatcher&) = delete;
  FdWatcher& operator=(const FdWatcher&) = delete;

  Status Start();
  // Fires every pending watch with kStopped, then joins the thread. Later
  // Watch calls fail with DYAD_RC_CANCELLED. Idempotent.
  void Stop();

  // A descriptor and what to wait for on it: readable (POLLIN) or writable
  // (POLLOUT); a hang-up or an error counts as ready either way.
  struct Interest {
    int fd = -1;
    short events = POLLIN;
  };
  // Calls `cb` once `fd` is readable (or hung up, or in error), or with
  // kTimeout once `deadline` passes. Returns a ticket for Cancel.
  Result<uint64_t> Watch(int fd, Deadline deadline, Callback cb) {
    return Watch({Interest{fd, POLLIN}, Interest{}}, deadline, std::move(cb));
  }
  // The same for whichever of two descriptors is ready first (fd -1: none;
  // the same descriptor twice: either of its events).
  Result<uint64_t> Watch(std::array<Interest, 2> any, Deadline deadline, Callback cb);
  // True when the watch was still pending: its callback will never run.
  // False when it fired (or is firing) already. The caller may close the
  // descriptor once this returns.
  bool Cancel(uint64_t ticket);

  size_t pending() const;

 private:
  struct Entry {
    std::array<int, 2> fds{-1, -1};  // registered with epoll
    Deadline deadline = Deadline::Never();
    Callback cb;
  };
  void Loop();
  void Wake();
  // Removes the watch `ticket` (under mu_): its entry, epoll registration
  // and deadline. False when there is none.
  bool TakeLocked(uint64_t ticket, Callback* cb);
  int NextTimeoutMsLocked() const;

  UniqueFd epoll_;
  UniqueFd wake_;
  std::thread thread_;
  mutable std::mutex mu_;
  bool running_ = false;
  uint64_t next_ticket_ = 1;
  std::unordered_map<uint64_t, Entry> entries_;
  std::multimap<SteadyClock::time_point, uint64_t> deadlines_;
};

}  // namespace dyad
