#include "service/peer_dial.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

namespace dyad {

namespace {

Resumable::Wait WaitOn(int fd, short events, Deadline deadline) {
  Resumable::Wait w;
  w.fd = fd;
  w.events = events;
  w.deadline = deadline;
  return w;
}

// True when `fd` is ready for `events` now (a hang-up or error counts).
bool ReadyNow(int fd, short events) {
  pollfd p{fd, events, 0};
  for (;;) {
    const int n = ::poll(&p, 1, 0);
    if (n < 0 && errno == EINTR) continue;
    return n != 0;  // an error: the next call reports it
  }
}

}  // namespace

PeerDial::PeerDial(PeerDirectory* peers, uint32_t rank, Deadline deadline)
    : peers_(peers),
      rank_(rank),
      deadline_(deadline),
      dial_deadline_(deadline),
      result_(Status(DYAD_RC_CANCELLED, "the dial did not end")) {}

PeerDial::~PeerDial() {
  if (stage_ != Stage::kDone) Abandon(Status(DYAD_RC_CANCELLED, "abandoned"));
}

bool PeerDial::Step(Wait* wait) {
  for (;;) {
    bool waits = false;
    switch (stage_) {
      case Stage::kStart:
        waits = Start(wait);
        break;
      case Stage::kJoined:
        waits = WaitJoined(wait);
        break;
      case Stage::kConnecting:
        waits = Connected(wait);
        break;
      case Stage::kHandshake:
        waits = Handshake(wait);
        break;
      case Stage::kDone:
        return true;
    }
    if (waits) return false;
  }
}

bool PeerDial::Start(Wait* wait) {
  if (std::unique_ptr<Channel> idle = peers_->TakeIdle(rank_)) {
    End(std::move(idle));
    return false;
  }
  Result<ServiceRecord> rec = peers_->Resolve(rank_, false);
  if (!rec.ok()) {
    End(rec.status());
    return false;
  }
  rec_ = *rec;
  Result<SocketAddress> addr = ParseAddress(rec_.address);
  if (!addr.ok()) {
    DialEnded(addr.status());
    return false;
  }
  addr_ = *addr;
  dial_deadline_ = deadline_.Min(peers_->rpc_timeout_ms());
  if (!alone_) {
    flight_ = peers_->JoinDial(rank_, dial_deadline_, &lead_);
    if (flight_ && !lead_) {
      joined_ = true;
      joined_fd_.reset(::dup(flight_->done_fd.get()));
      if (!joined_fd_.valid()) {
        End(StatusFromErrno(errno, "dup"));
        return false;
      }
      JoinBy();
      stage_ = Stage::kJoined;
      return WaitJoined(wait);
    }
  }
  return BeginConnect(wait);
}

bool PeerDial::WaitJoined(Wait* wait) {
  bool done = false;
  const Status st = peers_->DialOutcome(*flight_, &done);
  if (!done) {
    *wait = WaitOn(joined_fd_.get(), POLLIN, join_deadline_);
    return true;
  }
  LeaveFlight();
  if (st.ok()) {
    alone_ = true;  // the owner answers: take the pooled session or dial one
    stage_ = Stage::kStart;
  } else if (st.code() == DYAD_RC_CANCELLED) {
    stage_ = Stage::kStart;  // its requester went away: one of its waiters leads now
  } else {
    End(st);
  }
  return false;
}

// Until our deadline; a dial that ends a little after it (it began a
// little later, as it usually does when the callers started together) is
// waited for, so the waiters report its error rather than a timeout of
// their own.
void PeerDial::JoinBy() {
  constexpr int64_t kOutcomeGraceMs = 250;
  join_deadline_ = deadline_;
  const Deadline theirs = flight_->deadline;
  if (deadline_.never() || theirs.never()) return;
  const int64_t left = theirs.RemainingMs();
  if (left <= deadline_.RemainingMs() + kOutcomeGraceMs)
    join_deadline_ = Deadline::AfterMs(left + kOutcomeGraceMs);
}

bool PeerDial::BeginConnect(Wait* wait) {
  bool connected = false;
  Result<UniqueFd> fd = ConnectStart(addr_, &connected);
  if (!fd.ok()) {
    DialEnded(fd.status());
    return false;
  }
  connecting_ = std::move(*fd);
  stage_ = Stage::kConnecting;
  if (connected) return Connected(wait);
  *wait = WaitOn(connecting_.get(), POLLOUT, dial_deadline_);
  return true;
}

bool PeerDial::Connected(Wait* wait) {
  if (!ch_) {
    if (!ReadyNow(connecting_.get(), POLLOUT)) {
      *wait = WaitOn(connecting_.get(), POLLOUT, dial_deadline_);
      return true;
    }
    if (Status st = ConnectFinish(connecting_.get(), addr_); !st.ok()) {
      DialEnded(st);
      return false;
    }
    ch_ = std::make_unique<Channel>(std::move(connecting_), Trust::kUnauthenticated);
  }
  hs_ = std::make_unique<ClientHandshake>(peers_->auth(), peers_->self());
  stage_ = Stage::kHandshake;
  return Handshake(wait);
}

bool PeerDial::Handshake(Wait* wait) {
  if (!hs_->Step(*ch_, dial_deadline_)) {
    *wait = Wait{ch_.get(), dial_deadline_};
    return true;
  }
  DialEnded(hs_->status());
  return false;
}

void PeerDial::DialEnded(const Status& st) {
  const PeerIdentity peer = hs_ ? hs_->peer() : PeerIdentity{};
  Result<std::unique_ptr<Channel>> r = st;
  if (st.ok()) r = std::move(ch_);
  ch_.reset();  // a failed handshake's channel: closed here
  hs_.reset();
  connecting_.reset();
  r = peers_->FinishDial(rank_, rec_, std::move(r), peer);
  if (lead_ && flight_) peers_->EndDial(rank_, flight_, r.ok() ? Status::OK() : r.status());
  End(std::move(r));
}

void PeerDial::Expired() {
  switch (stage_) {
    case Stage::kJoined:
      LeaveFlight();
      End(Status(DYAD_RC_TIMEOUT, "connect to dyad-service rank " + std::to_string(rank_) + " at " +
                                      rec_.address +
                                      ": timed out waiting for the connection another "
                                      "request is making"));
      return;
    case Stage::kConnecting:
      DialEnded(Status(DYAD_RC_TIMEOUT, "connect " + addr_.ToString() + " timed out"));
      return;
    case Stage::kHandshake:
      hs_->Expired(*ch_);
      DialEnded(hs_->status());
      return;
    default:
      return;
  }
}

void PeerDial::Abandon(const Status& why) {
  if (stage_ == Stage::kDone) return;
  if (lead_ && flight_)
    peers_->EndDial(rank_, flight_,
                    Status(DYAD_RC_CANCELLED, "the request that was connecting went away"));
  End(why);
}

void PeerDial::LeaveFlight() {
  if (joined_) peers_->LeaveDial();
  joined_ = false;
  joined_fd_.reset();
  flight_.reset();
  lead_ = false;
}

void PeerDial::End(Result<std::unique_ptr<Channel>> r) {
  LeaveFlight();
  hs_.reset();
  ch_.reset();  // closes an unfinished dial's socket
  connecting_.reset();
  result_ = std::move(r);
  stage_ = Stage::kDone;
}

Result<std::unique_ptr<Channel>> PeerDial::Take() { return std::move(result_); }

}  // namespace dyad
