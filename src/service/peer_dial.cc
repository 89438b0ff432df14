#include "service/peer_dial.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string>

#include "proto/auth.h"

namespace dyad {

namespace {

// Bytes a peer session reads at once (Channel::SetReadAhead).
constexpr size_t kPeerReadAhead = 16u << 10;

// Until `deadline`; a dial that ends a little after it (it began a little
// later, as it usually does when the callers started together) is waited
// for, so the waiters report its error rather than a timeout of their own.
Deadline JoinBy(Deadline deadline, Deadline theirs) {
  constexpr int64_t kOutcomeGraceMs = 250;
  if (deadline.never() || theirs.never()) return deadline;
  const int64_t left = theirs.RemainingMs();
  if (left <= deadline.RemainingMs() + kOutcomeGraceMs)
    return Deadline::AfterMs(left + kOutcomeGraceMs);
  return deadline;
}

// The outcome of another caller's dial to `rank`: OK (the owner answers),
// CANCELLED (its requester went away: one of its waiters leads now), or
// why it failed, timed out or this caller's Stop fired.
Task<Status> AwaitFlight(PeerDirectory& peers, uint32_t rank, const std::string& address,
                         PeerDirectory::DialFlight& flight, Deadline deadline, PeerWaits& waits) {
  // A duplicate of the flight's eventfd: one watch per descriptor.
  UniqueFd fd(::dup(flight.done_fd.get()));
  Status st = fd.valid() ? Status::OK() : StatusFromErrno(errno, "dup");
  const Deadline until = JoinBy(deadline, flight.deadline);
  while (st.ok()) {
    bool done = false;
    const Status outcome = peers.DialOutcome(flight, &done);
    if (done) {
      st = outcome;
      break;
    }
    const Ready r = co_await waits.OnFd(fd.get(), POLLIN, until);
    if (r == Ready::kStopped) st = waits.Stopped();
    if (r == Ready::kTimeout)
      st = Status(DYAD_RC_TIMEOUT, "connect to dyad-service rank " + std::to_string(rank) + " at " +
                                       address +
                                       ": timed out waiting for the connection another "
                                       "request is making");
  }
  peers.LeaveDial();
  co_return st;
}

// One connection and handshake. `*cut`: the owner accepted the connection
// and then closed it during the handshake.
Task<Result<std::unique_ptr<Channel>>> ConnectOnce(PeerDirectory& peers, const SocketAddress& addr,
                                                   Deadline deadline, PeerWaits& waits,
                                                   PeerIdentity* peer, bool* stopped, bool* cut) {
  bool connected = false;
  Result<UniqueFd> fd = ConnectStart(addr, &connected);
  if (!fd.ok()) co_return fd.status();
  if (!connected) {
    const Ready r = co_await waits.OnFd(fd->get(), POLLOUT, deadline);
    if (r == Ready::kTimeout)
      co_return Status(DYAD_RC_TIMEOUT, "connect " + addr.ToString() + " timed out");
    if (r == Ready::kStopped) {
      *stopped = true;
      co_return waits.Stopped();
    }
    if (Status st = ConnectFinish(fd->get(), addr); !st.ok()) co_return st;
  }
  auto ch = std::make_unique<Channel>(std::move(*fd), Trust::kUnauthenticated);
  ClientHandshake hs(peers.auth(), peers.self());
  while (!hs.Step(*ch, deadline)) {
    const Ready r = co_await waits.Readable(*ch, deadline);
    if (r == Ready::kStopped) {
      *stopped = true;
      co_return waits.Stopped();
    }
    if (r == Ready::kTimeout) {
      hs.Expired(*ch);
      break;
    }
  }
  if (!hs.status().ok()) {
    *cut = hs.status().code() == DYAD_RC_CONNLOST;
    co_return hs.status();
  }
  *peer = hs.peer();
  // A small file's reply, data and verdict then come in one or two
  // receives instead of a header and a payload receive per frame.
  ch->SetReadAhead(kPeerReadAhead);
  co_return std::move(ch);
}

}  // namespace

Task<Result<std::unique_ptr<Channel>>> ConnectPeer(PeerDirectory& peers, const SocketAddress& addr,
                                                   Deadline deadline, PeerWaits& waits,
                                                   PeerIdentity* peer, bool* stopped) {
  // An owner flooded with connections that never authenticate closes
  // handshakes in progress to make room, and refuses newcomers when none
  // can go (docs/security.md): ours may be one. It says so when it can
  // (HandshakeBusy): such a handshake is made again after pauses that
  // double from 10 ms to 160 ms, until the deadline, so that a flood slows
  // new sessions rather than fails them. A handshake cut without a word is
  // made again five times (about 0.3 s in all): an owner that keeps hanging
  // up still fails the dial within a second or so.
  constexpr int kRedials = 5;
  constexpr int64_t kLongestPauseMs = 160;
  int64_t pause_ms = 10;
  for (int cuts = 0;;) {
    bool cut = false;
    Result<std::unique_ptr<Channel>> ch =
        co_await ConnectOnce(peers, addr, deadline, waits, peer, stopped, &cut);
    if (ch.ok() || *stopped || deadline.RemainingMs() <= pause_ms) co_return ch;
    if (!IsHandshakeBusy(ch.status()) && (!cut || cuts++ == kRedials)) co_return ch;
    if (co_await waits.OnFd(-1, 0, Deadline::AfterMs(pause_ms)) == Ready::kStopped) {
      *stopped = true;
      co_return waits.Stopped();
    }
    pause_ms = std::min(pause_ms * 2, kLongestPauseMs);
  }
}

namespace {

// Ends the flight a caller leads: with the dial's outcome, or, when the
// caller went away first (its Stop, or its task dropped), as abandoned so
// that one of the waiters leads the next.
struct Leading {
  PeerDirectory& peers;
  const uint32_t rank;
  std::shared_ptr<PeerDirectory::DialFlight> flight;
  void End(const Status& st) {
    if (flight) peers.EndDial(rank, flight, st);
    flight.reset();
  }
  ~Leading() { End(Status(DYAD_RC_CANCELLED, "the request that was connecting went away")); }
};

}  // namespace

Task<Result<std::unique_ptr<Channel>>> DialPeer(PeerDirectory& peers, uint32_t rank,
                                                Deadline deadline, PeerWaits& waits) {
  // Another's dial succeeded: this one may dial without a flight, as one
  // of at most PeerDirectory::kMaxDialsAlone.
  struct Alone {
    PeerDirectory& peers;
    const uint32_t rank;
    bool held = false;
    ~Alone() {
      if (held) peers.EndDialAlone(rank);
    }
  } alone{peers, rank};
  for (;;) {
    if (std::unique_ptr<Channel> idle = peers.TakeIdle(rank)) co_return std::move(idle);
    Result<ServiceRecord> rec = co_await peers.Resolve(rank, false);
    if (!rec.ok()) co_return rec.status();
    const Deadline dial_by = deadline.Min(peers.rpc_timeout_ms());
    std::shared_ptr<PeerDirectory::DialFlight> flight;
    bool lead = false;
    if (!alone.held) {
      flight = peers.JoinDial(rank, dial_by, &lead);
      if (flight && !lead) {
        const Status st = co_await AwaitFlight(peers, rank, rec->address, *flight, deadline, waits);
        if (waits.stopped()) co_return waits.Stopped();  // (no new dial for a caller gone)
        // The owner answers: take a pooled session, or dial one (alone, or
        // in the next flight when enough dial alone already).
        if (st.ok()) alone.held = peers.BeginDialAlone(rank);
        if (st.ok() || st.code() == DYAD_RC_CANCELLED) continue;
        co_return st;
      }
    }
    Leading leading{peers, rank, lead ? flight : nullptr};
    Result<std::unique_ptr<Channel>> ch = Status(DYAD_RC_CANCELLED, "the dial did not end");
    PeerIdentity peer;
    bool stopped = false;
    Result<SocketAddress> addr = ParseAddress(rec->address);
    if (!addr.ok())
      ch = addr.status();
    else
      ch = co_await ConnectPeer(peers, *addr, dial_by, waits, &peer, &stopped);
    if (stopped) co_return ch;  // (the flight ends as abandoned)
    ch = co_await peers.FinishDial(rank, *rec, std::move(ch), peer);
    leading.End(ch.ok() ? Status::OK() : ch.status());
    co_return ch;
  }
}

}  // namespace dyad
