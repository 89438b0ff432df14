// transfers.h: the transfers a service has in flight, for `dyad status`.
//
// Each side of a transfer registers it for as long as it runs: Placement's
// fetcher on the receiving side, the FileServer on the sending side. An
// entry carries what is known up front (file, peer, transport, size) and a
// probe that measures progress only when someone asks, so a transfer pays
// one registration and nothing per chunk: the receiver's probe reads the
// size of the temporary it writes (SinkProgress), the sender's the bytes its
// peer acknowledged on the session when the transport streams the file there
// (SessionProgress); other transports report bytes done as unknown.
//
// Thread-safe. Probes run under the registry's lock, and an entry is removed
// (its destructor takes the lock) before the descriptors it watches close.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <mutex>
#include <string>
#include <vector>

#include "proto/protocol.h"

namespace dyad {

class TransferRegistry {
 public:
  // Bytes done so far, or TransferInfo::kUnknownBytes.
  using Probe = std::function<uint64_t()>;

  // Registration of one transfer; unregisters on destruction. Move-only.
  class Entry {
   public:
    Entry() = default;
    Entry(Entry&& o) noexcept { *this = std::move(o); }
    Entry& operator=(Entry&& o) noexcept;
    Entry(const Entry&) = delete;
    Entry& operator=(const Entry&) = delete;
    ~Entry() { Reset(); }
    void Reset();

   private:
    friend class TransferRegistry;
    struct Item;
    TransferRegistry* registry_ = nullptr;
    std::list<Item>::iterator it_;
  };

  TransferRegistry() = default;
  TransferRegistry(const TransferRegistry&) = delete;
  TransferRegistry& operator=(const TransferRegistry&) = delete;

  Entry Begin(bool outgoing, const std::string& upath, uint32_t peer_rank,
              const std::string& transport, uint64_t bytes_total, Probe probe);
  // Every transfer in flight, progress measured now.
  std::vector<TransferInfo> Snapshot() const;
  size_t size() const;

 private:
  mutable std::mutex mu_;
  std::list<Entry::Item> items_;
};

struct TransferRegistry::Entry::Item {
  TransferInfo info;
  uint64_t started_mono_ns = 0;
  Probe probe;
};

// Progress of a receiver writing `sink_fd` from offset 0: its current size.
// The probe uses the descriptor itself: its entry must go before the sink
// closes (as every entry's, above).
TransferRegistry::Probe SinkProgress(int sink_fd);
// Progress of a sender streaming on the TCP socket `fd`: bytes acknowledged
// by the peer since now (TCP_INFO), capped at `total`.
TransferRegistry::Probe SessionProgress(int fd, uint64_t total);

}  // namespace dyad
