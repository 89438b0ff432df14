// local_transport.h: the "local" transport, for two services on one node.
//
// Nothing crosses the session: the owner's FetchReply carries the absolute
// path of the validated file (ReplyArgs), the push sends nothing, and the
// requester's pull copies the bytes itself inside the kernel (copy_file_range, which
// may share extents on filesystems that support it; then sendfile; then
// read/write through a bounded buffer). Holes in a sparse source are kept as
// holes. The requester opens the path with O_NOFOLLOW and requires a regular
// file at least as long as promised; since both services run on one node
// under one operator this is not a security boundary, only a sanity check.
//
// Threading: a LocalTransport holds only immutable options; one instance is
// shared by every concurrent transfer of a service. CopyRange is a pure
// function of its descriptors and may be called from any thread.
#pragma once

#include <cstdint>
#include <string>

#include "transport/transport.h"

namespace dyad {

class LocalTransport final : public Transport {
 public:
  explicit LocalTransport(const TransportOptions& options);

  std::string name() const override { return "local"; }

  Result<std::string> ReplyArgs(const FileSource& src) override;
  // The requester's copy, on the runtime's pool (it may wait on the disk,
  // never on the peer).
  Task<Status> Pull(Channel& session, uint64_t size, const std::string& reply_args, int sink_fd,
                    TransferStats* stats, TransferWaits& waits) override;
  // Nothing to send.
  Task<Status> Push(Channel& session, const FileSource& src, const std::string& request_args,
                    TransferStats* stats, TransferWaits& waits) override;

  // Copies bytes [0, size) of `src_fd` to `dst_fd` at dst_fd's current file
  // position, leaving that position just past the copied range and the
  // source's position untouched. Holes of the source stay holes when the
  // destination is a regular file. Fails with DYAD_RC_BADFIO if the source
  // ends before `size` bytes. For the service when it owns both files (no
  // session involved).
  static Status CopyRange(int src_fd, int dst_fd, uint64_t size, TransferStats* stats);
};

}  // namespace dyad
