// advertise.h: which address a service gives its peers, and where its
// metadata store lives.
//
// A service registers one HOST:PORT that every other service connects to.
// Listening on all interfaces (the default 0.0.0.0), the host name is the
// obvious choice, but on many clusters and in containers the host name
// resolves to 127.0.0.1 or 127.0.1.1, and an address like that sends every
// peer to itself. So when the root or the store is on another host the
// service advertises the address of the interface that routes to that host
// (asking the kernel's routing table with an unconnected UDP socket), and
// refuses to start, naming --advertise, when it cannot find one. When the
// store is on this host (the root itself, a local Redis) it keeps the host
// name if that resolves beyond loopback, else takes the first address of an
// interface that is up.
//
// NetView is the seam tests use to play a host whose name resolves to
// loopback without touching the machine. Stateless; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace dyad {

class NetView {
 public:
  virtual ~NetView() = default;
  // IPv4 addresses `host` resolves to (dotted quads); empty when it does not.
  virtual std::vector<std::string> Resolve(const std::string& host) const = 0;
  // The local address the kernel would use to reach `ip` ("" without a route).
  virtual std::string SourceFor(const std::string& ip) const = 0;
  // IPv4 addresses of this host's interfaces that are up, loopback included.
  virtual std::vector<std::string> LocalAddresses() const = 0;
};
// The machine's own resolver, routing table and interfaces.
const NetView& SystemNetView();

bool IsLoopbackIp(const std::string& ip);

// HOST and PORT of the store a URL names when it is reached over TCP
// ("embedded://root:7590", "redis://user:pw@host:6379/0"); host "" for a
// store that is this process (embedded root, memory). Port 0 when the URL
// gives none.
struct StoreEndpoint {
  std::string host;
  uint16_t port = 0;
};
StoreEndpoint StoreEndpointOf(const std::string& kvs_url);

struct AdvertiseInput {
  std::string listen_host;       // host of --listen ("0.0.0.0" or "*": all interfaces)
  uint16_t port = 0;             // the bound port
  std::string hostname;          // gethostname()
  std::string store_host;        // StoreEndpointOf(--kvs).host
  std::string explicit_address;  // --advertise ("" = choose)
};

struct AdvertiseChoice {
  std::string address;  // HOST:PORT
  std::string note;     // why, when the choice is not the obvious one ("" otherwise)
};

// The address to advertise, or DYAD_RC_BADREQUEST naming --advertise when
// every candidate is a loopback address and the store is on another host.
Result<AdvertiseChoice> ChooseAdvertiseAddress(const AdvertiseInput& in, const NetView& net);

}  // namespace dyad
