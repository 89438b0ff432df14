// ucx_transport.h: the "ucx" transport (DTL mode UCX). File bytes move as
// UCX tagged messages into receives the requester posted on its registered
// memory or, between services on one host, are written by the owner
// straight into the requester's registered shared memory; the fetch
// session carries only small control frames. docs/ucx.md describes the
// protocol, resources, failures and settings; the parts are:
//   ucx_worker    UCX context and worker, progress thread, request waits
//   ucx_config    context tuning and what the context found; DYAD_UCX_*
//   ucx_endpoints cached endpoints to requesters, tagged sends
//   ucx_pool      registered buffers, pools and leases
//   ucx_direct    same-host mappings of requesters' buffers
//   ucx_wire      transport arguments, session frames, chunk tags
//   ucx_wake      a transfer's event fd, made readable by its completions
//   ucx_push/pull the owner's and the requester's transfers (coroutines)
//
// Threading: thread-safe; one instance is shared by every concurrent
// transfer of a service. Each transfer is one coroutine on a runtime's
// loop, the only user of its session meanwhile.
#pragma once

#include <memory>
#include <string>

#include "transport/transport.h"

namespace dyad {
namespace ucx {
struct Resources;
}  // namespace ucx

class UcxTransport final : public Transport {
 public:
  explicit UcxTransport(const TransportOptions& options);
  ~UcxTransport() override;
  UcxTransport(const UcxTransport&) = delete;
  UcxTransport& operator=(const UcxTransport&) = delete;

  std::string name() const override { return "ucx"; }

  Result<std::string> PrepareRequest() override;
  Status Warm() override;
  std::string Details() const override;
  // The coroutines of ucx_pull.cc and ucx_push.cc.
  Task<Status> Pull(Channel& session, uint64_t size, const std::string& reply_args, int sink_fd,
                    TransferStats* stats, TransferWaits& waits) override;
  Task<Status> Push(Channel& session, const FileSource& src, const std::string& request_args,
                    TransferStats* stats, TransferWaits& waits) override;

 private:
  const std::unique_ptr<ucx::Resources> resources_;
};

}  // namespace dyad
