#include "service/fd_watch.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "common/log.h"

namespace dyad {

Status FdWatcher::Start() {
  epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_.valid()) return StatusFromErrno(errno, "epoll_create1");
  wake_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_.valid()) return StatusFromErrno(errno, "eventfd");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = 0;  // tickets start at 1
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, wake_.get(), &ev) != 0)
    return StatusFromErrno(errno, "epoll_ctl");
  {
    std::lock_guard<std::mutex> lk(mu_);
    running_ = true;
  }
  thread_ = std::thread([this] { Loop(); });
  return Status::OK();
}

void FdWatcher::Stop() {
  std::vector<Callback> stopped;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!running_) return;
    running_ = false;
    for (auto& [ticket, e] : entries_) {
      for (int fd : e.fds)
        if (fd >= 0) (void)::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
      stopped.push_back(std::move(e.cb));
    }
    entries_.clear();
    deadlines_.clear();
  }
  Wake();
  if (thread_.joinable()) thread_.join();
  for (Callback& cb : stopped) cb(Event::kStopped);
}

namespace {
uint32_t EpollEvents(short events) {
  uint32_t ev = EPOLLRDHUP | EPOLLONESHOT;
  if (events & POLLIN) ev |= EPOLLIN;
  if (events & POLLOUT) ev |= EPOLLOUT;
  return ev;
}
}  // namespace

Result<uint64_t> FdWatcher::Watch(std::array<Interest, 2> any, Deadline deadline, Callback cb) {
  if (any[0].fd >= 0 && any[0].fd == any[1].fd) {
    any[0].events |= any[1].events;
    any[1].fd = -1;
  }
  std::lock_guard<std::mutex> lk(mu_);
  if (!running_) return Status(DYAD_RC_CANCELLED, "the service is stopping");
  const uint64_t ticket = next_ticket_++;
  Entry entry;
  for (size_t i = 0; i < any.size(); ++i) {
    if (any[i].fd < 0) continue;
    epoll_event ev{};
    ev.events = EpollEvents(any[i].events);
    ev.data.u64 = ticket;
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, any[i].fd, &ev) != 0) {
      const int err = errno;
      if (entry.fds[0] >= 0) (void)::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, entry.fds[0], nullptr);
      return StatusFromErrno(err, "watch a descriptor (epoll_ctl)");
    }
    entry.fds[i] = any[i].fd;
  }
  const bool earliest = !deadline.never() &&
                        (deadlines_.empty() || deadline.time_point() < deadlines_.begin()->first);
  entry.deadline = deadline;
  entry.cb = std::move(cb);
  entries_[ticket] = std::move(entry);
  if (!deadline.never()) deadlines_.emplace(deadline.time_point(), ticket);
  // The loop sleeps until the earliest deadline it knew of.
  if (earliest) Wake();
  return ticket;
}

bool FdWatcher::TakeLocked(uint64_t ticket, Callback* cb) {
  auto it = entries_.find(ticket);
  if (it == entries_.end()) return false;
  Entry& e = it->second;
  for (int fd : e.fds)
    if (fd >= 0) (void)::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
  if (!e.deadline.never()) {
    auto [lo, hi] = deadlines_.equal_range(e.deadline.time_point());
    for (auto d = lo; d != hi; ++d) {
      if (d->second == ticket) {
        deadlines_.erase(d);
        break;
      }
    }
  }
  *cb = std::move(e.cb);
  entries_.erase(it);
  return true;
}

bool FdWatcher::Cancel(uint64_t ticket) {
  Callback cb;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!TakeLocked(ticket, &cb)) return false;
  }
  return true;  // `cb` is dropped here, outside the lock
}

size_t FdWatcher::pending() const {
  std::lock_guard<std::mutex> lk(mu_);
  return entries_.size();
}

void FdWatcher::Wake() {
  const uint64_t one = 1;
  (void)!::write(wake_.get(), &one, sizeof one);
}

int FdWatcher::NextTimeoutMsLocked() const {
  if (deadlines_.empty()) return -1;
  const auto left = deadlines_.begin()->first - SteadyClock::now();
  if (left <= SteadyClock::duration::zero()) return 0;
  // Rounded up: waking before the deadline would only loop.
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return ms > INT32_MAX ? INT32_MAX : static_cast<int>(ms);
}

void FdWatcher::Loop() {
  std::vector<epoll_event> events(64);
  for (;;) {
    int timeout;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!running_) return;
      timeout = NextTimeoutMsLocked();
    }
    const int n =
        ::epoll_wait(epoll_.get(), events.data(), static_cast<int>(events.size()), timeout);
    if (n < 0 && errno != EINTR) {
      DYAD_LOG_ERROR("fd watcher: epoll_wait: %s", std::strerror(errno));
      return;
    }
    std::vector<std::pair<Callback, Event>> fire;
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (int i = 0; i < n; ++i) {
        const uint64_t ticket = events[i].data.u64;
        Callback cb;
        if (ticket == 0) {
          uint64_t drained;
          (void)!::read(wake_.get(), &drained, sizeof drained);
        } else if (TakeLocked(ticket, &cb)) {
          fire.emplace_back(std::move(cb), Event::kReady);
        }
      }
      const auto now = SteadyClock::now();
      while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
        Callback cb;
        if (TakeLocked(deadlines_.begin()->second, &cb))
          fire.emplace_back(std::move(cb), Event::kTimeout);
        else
          deadlines_.erase(deadlines_.begin());  // never without an entry; never loop on one
      }
    }
    for (auto& [cb, ev] : fire) cb(ev);
  }
}

}  // namespace dyad
