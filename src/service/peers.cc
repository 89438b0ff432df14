#include "service/peers.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "common/log.h"
#include "common/time.h"
#include "service/peer_dial.h"
#include "service/peer_rpc.h"
#include "service/peer_waits.h"

namespace dyad {

namespace {
constexpr size_t kMaxIdleSessionsPerPeer = 8;

std::string Hex(uint64_t v) {
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}
}  // namespace

PeerDirectory::PeerDirectory(Kvs* kvs, const Authenticator* auth, PeerIdentity self,
                             int64_t rpc_timeout_ms)
    : kvs_(kvs), auth_(auth), self_(self), rpc_timeout_ms_(rpc_timeout_ms) {}

std::optional<ServiceRecord> PeerDirectory::Cached(uint32_t rank) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = peers_.find(rank);
  if (it == peers_.end() || !it->second.have_record) return std::nullopt;
  return it->second.record;
}

Task<Result<ServiceRecord>> PeerDirectory::Resolve(uint32_t rank, bool refresh) {
  if (!refresh) {
    if (std::optional<ServiceRecord> known = Cached(rank)) co_return std::move(*known);
  }
  Result<std::optional<std::string>> v =
      co_await kvs_->GetTask(*rt_, kMembersNamespace, MemberKey(rank));
  if (!v.ok()) co_return v.status().Annotate("resolve service rank " + std::to_string(rank));
  if (!v->has_value())
    co_return Status(DYAD_RC_NOTFOUND, "no dyad-service with rank " + std::to_string(rank) +
                                           " is registered (is it running?)");
  ServiceRecord rec;
  if (!ServiceRecord::Decode(**v, &rec))
    co_return Status(DYAD_RC_BADMETADATA,
                     "malformed membership record for rank " + std::to_string(rank));
  std::lock_guard<std::mutex> lk(mu_);
  Peer& p = peers_[rank];
  if (p.have_record && p.record.incarnation != rec.incarnation) p.idle.clear();
  p.have_record = true;
  p.record = rec;
  co_return rec;
}

std::unique_ptr<Channel> PeerDirectory::TakeIdle(uint32_t rank) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = peers_.find(rank);
  if (it == peers_.end()) return nullptr;
  auto& idle = it->second.idle;
  while (!idle.empty()) {
    std::unique_ptr<Channel> ch = std::move(idle.back());
    idle.pop_back();
    // A session past its age is closed: the next one gets a new handshake.
    // So is one with anything to read (a hang-up, or bytes its owner sent
    // after the exchange that ended, such as a second reply): the next
    // request on it would take them for its answer.
    pollfd p{ch->fd(), POLLIN, 0};
    if (!ch->broken() && !ch->Retired() && ::poll(&p, 1, 0) == 0) return ch;
  }
  return nullptr;
}

std::shared_ptr<PeerDirectory::DialFlight> PeerDirectory::JoinDial(uint32_t rank, Deadline deadline,
                                                                   bool* lead) {
  std::lock_guard<std::mutex> lk(mu_);
  Peer& p = peers_[rank];
  if (p.dialing) {
    *lead = false;
    ++waiting_on_dial_;
    return p.dialing;
  }
  *lead = true;
  auto flight = std::make_shared<DialFlight>();
  flight->done_fd.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!flight->done_fd.valid()) return nullptr;  // the caller dials alone
  flight->deadline = deadline;
  p.dialing = flight;
  ++dialing_;
  return flight;
}

bool PeerDirectory::BeginDialAlone(uint32_t rank) {
  std::lock_guard<std::mutex> lk(mu_);
  Peer& p = peers_[rank];
  if (p.dials_alone >= kMaxDialsAlone) return false;
  ++p.dials_alone;
  ++dialing_;
  return true;
}

void PeerDirectory::EndDialAlone(uint32_t rank) {
  std::lock_guard<std::mutex> lk(mu_);
  --peers_[rank].dials_alone;
  --dialing_;
}

Status CredentialFailure(const Status& st, const std::string& what) {
  const std::string& m = st.message();
  const bool munge = m.find("MUNGE") != std::string::npos || m.find("munge") != std::string::npos;
  const bool secret = m.find("secret") != std::string::npos || !munge;
  const char* munge_hint =
      "every service must use MUNGE with the same munge key (munged running on each host with "
      "the cluster's /etc/munge/munge.key) and the same --munge setting";
  const char* secret_hint =
      "every service must use the same cluster secret: check --secret-file / DYAD_SECRET_FILE "
      "on both";
  const std::string hint = munge && secret ? std::string(secret_hint) + "; " + munge_hint
                           : munge         ? munge_hint
                                           : secret_hint;
  return Status(st.code(), what + ": " + st.message() + " (" + hint + ")").WithCause(st.cause());
}

Status PeerDirectory::DialOutcome(const DialFlight& flight, bool* done) {
  std::lock_guard<std::mutex> lk(mu_);
  *done = flight.done;
  return flight.status;
}

void PeerDirectory::EndDial(uint32_t rank, const std::shared_ptr<DialFlight>& flight,
                            const Status& st) {
  std::lock_guard<std::mutex> lk(mu_);
  if (flight->done) return;
  flight->done = true;
  flight->status = st;
  const uint64_t one = 1;  // stays readable: every joiner sees it
  (void)!::write(flight->done_fd.get(), &one, sizeof one);
  Peer& p = peers_[rank];
  if (p.dialing == flight) p.dialing.reset();
  --dialing_;
}

Task<Result<std::unique_ptr<Channel>>> PeerDirectory::FinishDial(
    uint32_t rank, const ServiceRecord& rec, Result<std::unique_ptr<Channel>> ch,
    const PeerIdentity& peer) {
  if (!ch.ok()) {
    if (ch.status().code() == DYAD_RC_AUTH)
      co_return CredentialFailure(
          ch.status(), "authenticate with rank " + std::to_string(rank) + " at " + rec.address);
    co_return ch.status().Annotate("connect to dyad-service rank " + std::to_string(rank) + " at " +
                                   rec.address);
  }
  if (peer.rank != rank || peer.incarnation != rec.incarnation)
    co_return co_await Mismatch(rank, rec, peer);
  Touch(rank);
  co_return ch;
}

// The address answered as another service. The same rank with a new
// incarnation is a restart (routine: the caller retries with the new
// record); another rank, still so after the record is re-read, is a
// misconfiguration worth an ERROR.
Task<Status> PeerDirectory::Mismatch(uint32_t rank, const ServiceRecord& rec,
                                     const PeerIdentity& peer) {
  Invalidate(rank);
  const std::string msg = "service at " + rec.address + " is rank " + std::to_string(peer.rank) +
                          " incarnation " + Hex(peer.incarnation) + ", expected rank " +
                          std::to_string(rank) + " incarnation " + Hex(rec.incarnation);
  if (peer.rank == rank) co_return Status(DYAD_RC_STALE, msg);
  Result<ServiceRecord> fresh = co_await Resolve(rank, true);
  if (fresh.ok() && fresh->address == rec.address) {
    bool report = false;
    {
      std::lock_guard<std::mutex> lk(mu_);
      Peer& p = peers_[rank];
      report = p.reported_incarnation != fresh->incarnation;
      p.reported_incarnation = fresh->incarnation;
    }
    if (report)
      DYAD_LOG_ERROR(
          "rank %u is registered at %s (host %s), but that address is answered by rank "
          "%u incarnation %s: rank %u advertises an address that is not its own (check "
          "its --advertise / DYAD_SERVICE_ADVERTISE: a host name that resolves to a "
          "loopback address is a common cause), or two services listen on one "
          "address; fix the address and restart rank %u",
          rank, rec.address.c_str(), rec.hostname.c_str(), peer.rank, Hex(peer.incarnation).c_str(),
          rank, rank);
  }
  co_return Status(DYAD_RC_STALE, msg);
}

Task<ProbeResult> PeerDirectory::Probe(const ServiceRecord& rec, Deadline deadline,
                                       PeerWaits& waits) {
  ProbeResult r;
  const uint64_t t0 = MonoNs();
  PeerIdentity peer;
  bool stopped = false;
  Result<std::unique_ptr<Channel>> ch = Status(DYAD_RC_CANCELLED, "not probed");
  Result<SocketAddress> addr = ParseAddress(rec.address);
  if (!addr.ok())
    ch = addr.status();
  else
    ch = co_await ConnectPeer(*this, *addr, deadline, waits, &peer, &stopped);
  if (!ch.ok()) {
    r.state = ch.status().code() == DYAD_RC_AUTH ? PeerState::kRefused : PeerState::kDown;
    r.status = ch.status();
    co_return r;
  }
  r.identity = peer;
  if (peer.rank != rec.rank || peer.incarnation != rec.incarnation) {
    r.state = PeerState::kOtherIdentity;
    r.status = Status(DYAD_RC_STALE, rec.address + " answers as rank " + std::to_string(peer.rank) +
                                         " incarnation " + Hex(peer.incarnation));
    co_return r;
  }
  Status st = (*ch)->SendFrame(static_cast<uint16_t>(MsgType::kPing), std::string(), deadline);
  std::string body;
  if (st.ok())
    st = co_await AwaitReply(**ch, deadline, waits, "no answer to a ping in time", &body, nullptr);
  r.rtt_ns = MonoNs() - t0;
  if (!st.ok()) {
    r.state = PeerState::kDown;
    r.status = st.Annotate("ping");
    co_return r;
  }
  r.state = PeerState::kAlive;
  Touch(rec.rank);
  co_return r;
}

void PeerDirectory::Touch(uint32_t rank) {
  std::lock_guard<std::mutex> lk(mu_);
  peers_[rank].last_contact_ns = WallNs();
}

uint64_t PeerDirectory::LastContact(uint32_t rank) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = peers_.find(rank);
  return it == peers_.end() ? 0 : it->second.last_contact_ns;
}

void PeerDirectory::Release(uint32_t rank, std::unique_ptr<Channel> ch) {
  // Bytes read ahead past the exchange that ended put the session out of
  // step: it is closed.
  if (!ch || ch->broken() || ch->Retired() || ch->has_unread()) return;
  std::lock_guard<std::mutex> lk(mu_);
  Peer& p = peers_[rank];
  p.last_contact_ns = WallNs();
  if (p.idle.size() < kMaxIdleSessionsPerPeer) p.idle.push_back(std::move(ch));
}

void PeerDirectory::Invalidate(uint32_t rank) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = peers_.find(rank);
  if (it == peers_.end()) return;
  it->second.have_record = false;
  it->second.idle.clear();
}

}  // namespace dyad
