// embedded_server.h: the root side of the "embedded" metadata store.
//
// The root dyad-service hosts the cluster's store in a MemoryKvs and serves
// the kKvsPut/Get/MultiGet/Wait/Remove/List requests other services send over their
// authenticated TCP links (proto/protocol.h). The service owns the sockets
// and the per-connection threads; for each frame whose type Handles()
// accepts it calls Handle(), which performs the request and sends exactly
// one kReply frame. A malformed request gets an error reply, never a crash
// or a silent drop, so one bad peer cannot desynchronise its own link.
//
// Server-side waits (kvs.wait, which clients of earlier releases send; the
// current client waits through kvs.watch) are bounded (at most
// kMaxWaitSliceMs per request; such a client loops over slices) and poll
// `cancel`, which the service wires to "the requesting peer hung up or the
// service is stopping".
//
// Threading: Handle() is thread-safe and is called concurrently from many
// connection threads, each with its own Channel.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/net.h"
#include "common/status.h"
#include "kvs/embedded/change_feed.h"
#include "kvs/kvs.h"
#include "kvs/memory/memory_kvs.h"

namespace dyad {

class EmbeddedKvsServer {
 public:
  // Upper bound of one server-side wait; longer client waits are sliced.
  static constexpr int64_t kMaxWaitSliceMs = 5000;
  static constexpr int64_t kDefaultReplyTimeoutMs = 30000;
  // Room for the reply header (code, message) inside one frame.
  static constexpr size_t kReplyHeadroom = 4096;
  // Largest body of a listing's reply: one frame. A listing that does not
  // fit is refused (measured before anything is copied), never truncated.
  static constexpr size_t kMaxListReplyBytes = kMaxFramePayload - kReplyHeadroom;
  // Value bytes one kKvsMultiGet reply carries (at least one value, of at
  // most a frame): the client asks again for the keys not answered. Small,
  // so a batched read served on the root's event loop copies no more than
  // a get of one large value does.
  static constexpr size_t kMultiGetReplyBytes = 1u << 20;

  // Serves `store`, or a store of its own when null. Sharing the store lets
  // the root service use it directly as its own Kvs.
  // `loop`: where the feeds' timer runs (and the store's, when this server
  // makes it): the root service's runtime; none: loops of their own.
  explicit EmbeddedKvsServer(std::shared_ptr<MemoryKvs> store = nullptr,
                             int64_t reply_timeout_ms = kDefaultReplyTimeoutMs,
                             std::optional<asio::any_io_executor> loop = std::nullopt);

  EmbeddedKvsServer(const EmbeddedKvsServer&) = delete;
  EmbeddedKvsServer& operator=(const EmbeddedKvsServer&) = delete;

  // True for the message types Handle() serves (kKvsPut .. kKvsWatch).
  static bool Handles(uint16_t type);

  // Performs one request and sends its reply on `ch`. The returned Status
  // is that of sending the reply: not OK means the link is unusable and the
  // caller should close it. Errors of the request itself travel in the reply.
  Status Handle(uint16_t type, const std::string& payload, Channel& ch, const CancelFn& cancel);

  // Sends the reply of a request of `type` whose outcome is `st` (and, when
  // OK, the encoded fields `body`); the Status is that of the send.
  Status SendResult(uint16_t type, const Status& st, const std::string& body, Channel& ch) const;

  // Wakes all waits in progress with DYAD_RC_CANCELLED (service shutdown).
  void Shutdown() {
    store_->Shutdown();
    feeds_->Shutdown();
  }

  const std::shared_ptr<MemoryKvs>& store() const { return store_; }
  ChangeFeeds& feeds() const { return *feeds_; }

 private:
  // Runs the request; on success fills `body` with the encoded reply fields.
  Status Execute(uint16_t type, const std::string& payload, const CancelFn& cancel,
                 std::string* body);
  Status ExecuteMultiGet(const std::string& payload, std::string* body);
  Status ExecuteWatch(const std::string& payload, const CancelFn& cancel, std::string* body);

  const std::shared_ptr<MemoryKvs> store_;
  const int64_t reply_timeout_ms_;
  const std::unique_ptr<ChangeFeeds> feeds_;
};

}  // namespace dyad
