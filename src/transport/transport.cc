// transport.cc: the one blocking driver of transfers (Transport::Pull and
// Push) and the settled op transports return when nothing needs to move.
#include "transport/transport.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>

#include "common/time.h"
#include "common/wire.h"

namespace dyad {
namespace {

// Longest single poll: a wake-up that an op's completions failed to signal
// costs at most this much, never a hang (a timer, not a spin).
constexpr int64_t kMaxPollMs = 1000;

Status IdleExpired(int64_t idle_ms) {
  return Status(DYAD_RC_TIMEOUT, "no progress for " + std::to_string(idle_ms) + " ms");
}

// Runs `op` to its end on this thread: steps it, and between steps sleeps
// until the session or the op's wake fd is readable (hang-ups and errors
// surface in the next Step). The idle bound restarts whenever moved()
// advances; its expiry fails the op with DYAD_RC_TIMEOUT. An op that
// blocks() (the local copy) finishes inside its Step: it is just stepped.
Status Drive(Channel& session, TransferOp& op) {
  uint64_t moved = op.moved();
  Deadline idle = IdleDeadline(op.idle_ms());
  for (;;) {
    Result<bool> r = op.Step();
    if (!r.ok()) return r.status();
    if (*r) return Status::OK();
    if (op.moved() != moved) {
      moved = op.moved();
      idle = IdleDeadline(op.idle_ms());
    }
    if (idle.expired()) return op.Fail(IdleExpired(op.idle_ms()));
    // Rounded up, so a wait that has not expired never polls for 0 ms.
    const int64_t ms = std::max<int64_t>(1, idle.RemainingMs(kMaxPollMs));
    const int wake = op.wake_fd();
    pollfd p[2] = {{session.fd(), POLLIN, 0}, {wake, POLLIN, 0}};
    // Readable, a signal (EINTR) or the poll's end: step again.
    if (::poll(p, wake >= 0 ? 2 : 1, static_cast<int>(ms)) < 0 && errno != EINTR)
      return op.Fail(StatusFromErrno(errno, "poll", DYAD_RC_CONNLOST));
  }
}

// Sends the chunks QueueChunk makes as the requester takes them.
Status PumpChunks(Transport& t, Channel& session, const FileSource& src, TransferStats* stats) {
  const int64_t idle_ms = t.options().idle_ms;
  WireQueue out;
  uint64_t offset = 0;
  while (offset < src.size || !out.empty()) {
    while (offset < src.size && out.Gathering(kGatheredFileBytes)) {
      DYAD_RETURN_IF_ERROR(t.QueueChunk(session, src, &offset, &out));
      ++stats->chunks;
    }
    // idle_ms bounds each wait for room (<= 0: no bound).
    Result<WireQueue::Pumped> p = out.Pump(session, idle_ms > 0 ? idle_ms : kMaxPollMs);
    Status st = p.status();
    if (st.ok() && *p == WireQueue::Pumped::kStalled && idle_ms > 0)
      st = Status(DYAD_RC_TIMEOUT, "peer made no progress for " + std::to_string(idle_ms) + " ms");
    stats->bytes = std::min<uint64_t>(out.sent(), src.size);
    if (!st.ok())
      return BreakSession(session, st.Annotate(t.name() + " push of '" + src.path + "' (sent " +
                                               std::to_string(out.sent()) + " bytes of " +
                                               std::to_string(src.size) + ")"));
  }
  stats->bytes = src.size;
  return Status::OK();
}

class Settled final : public TransferOp {
 public:
  Settled(Status result, int64_t idle_ms, Channel* session)
      : result_(std::move(result)), idle_ms_(idle_ms), session_(session) {}

  Result<bool> Step() override {
    if (result_.ok()) return true;
    return Fail(result_);
  }
  uint64_t moved() const override { return 0; }
  int64_t idle_ms() const override { return idle_ms_; }
  Status Fail(const Status& why) override {
    return session_ != nullptr ? BreakSession(*session_, why) : why;
  }

 private:
  const Status result_;
  const int64_t idle_ms_;
  Channel* const session_;
};

}  // namespace

Deadline IdleDeadline(int64_t idle_ms) {
  return idle_ms > 0 ? Deadline::AfterMs(idle_ms) : Deadline::Never();
}

Status BreakSession(Channel& session, const Status& st) {
  session.MarkBroken();
  ::shutdown(session.fd(), SHUT_RDWR);
  return st;
}

Status TellAndBreakSession(Channel& session, uint16_t error_frame, const Status& st) {
  Encoder e;
  e.I32(static_cast<int32_t>(st.code())).Str(st.message());
  (void)session.SendFrame(error_frame, e.data(), Deadline::AfterMs(100));
  return BreakSession(session, st);
}

std::unique_ptr<TransferOp> SettledOp(Status result, int64_t idle_ms, Channel* session) {
  return std::make_unique<Settled>(std::move(result), idle_ms, session);
}

Status Transport::Pull(Channel& session, uint64_t size, const std::string& reply_args, int sink_fd,
                       TransferStats* stats) {
  TransferStats local_stats;
  if (stats == nullptr) stats = &local_stats;
  *stats = TransferStats();
  std::unique_ptr<TransferOp> op = StartPull(session, size, reply_args, sink_fd, stats);
  return Drive(session, *op);
}

Status Transport::Push(Channel& session, const FileSource& src, const std::string& request_args,
                       TransferStats* stats) {
  TransferStats local_stats;
  if (stats == nullptr) stats = &local_stats;
  *stats = TransferStats();
  if (queues_chunks()) return PumpChunks(*this, session, src, stats);
  std::unique_ptr<TransferOp> op = StartPush(session, src, request_args, stats);
  return Drive(session, *op);
}

}  // namespace dyad
