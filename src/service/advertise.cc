#include "service/advertise.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "common/net.h"

namespace dyad {

namespace {

class SystemView final : public NetView {
 public:
  std::vector<std::string> Resolve(const std::string& host) const override {
    std::vector<std::string> out;
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return out;
    for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
      char buf[INET_ADDRSTRLEN];
      const auto* sin = reinterpret_cast<const sockaddr_in*>(a->ai_addr);
      if (inet_ntop(AF_INET, &sin->sin_addr, buf, sizeof buf) == nullptr) continue;
      if (std::find(out.begin(), out.end(), buf) == out.end()) out.emplace_back(buf);
    }
    freeaddrinfo(res);
    return out;
  }

  // connect(2) on a UDP socket sends nothing; it only asks the routing table
  // which source address a packet to `ip` would carry.
  std::string SourceFor(const std::string& ip) const override {
    sockaddr_in dst{};
    dst.sin_family = AF_INET;
    dst.sin_port = htons(9);  // any port: nothing is sent
    if (inet_pton(AF_INET, ip.c_str(), &dst.sin_addr) != 1) return "";
    UniqueFd fd(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (!fd.valid()) return "";
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&dst), sizeof dst) != 0) return "";
    sockaddr_in src{};
    socklen_t len = sizeof src;
    if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&src), &len) != 0) return "";
    char buf[INET_ADDRSTRLEN];
    if (inet_ntop(AF_INET, &src.sin_addr, buf, sizeof buf) == nullptr) return "";
    return buf;
  }

  std::vector<std::string> LocalAddresses() const override {
    std::vector<std::string> out;
    ifaddrs* ifs = nullptr;
    if (getifaddrs(&ifs) != 0) return out;
    for (ifaddrs* i = ifs; i != nullptr; i = i->ifa_next) {
      if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
      if ((i->ifa_flags & IFF_UP) == 0) continue;
      char buf[INET_ADDRSTRLEN];
      const auto* sin = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
      if (inet_ntop(AF_INET, &sin->sin_addr, buf, sizeof buf) != nullptr) out.emplace_back(buf);
    }
    freeifaddrs(ifs);
    return out;
  }
};

bool IsWildcard(const std::string& host) {
  return host.empty() || host == "0.0.0.0" || host == "*";
}

bool AllLoopback(const std::vector<std::string>& ips) {
  return !ips.empty() && std::all_of(ips.begin(), ips.end(), IsLoopbackIp);
}

bool Contains(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

std::string Join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& x : v) out += (out.empty() ? "" : ", ") + x;
  return out;
}

// The first address of `store_host` that is on another host ("" when the
// store is here or its name does not resolve).
std::string RemoteStoreIp(const std::string& store_host, const NetView& net) {
  if (store_host.empty()) return "";
  const std::vector<std::string> local = net.LocalAddresses();
  for (const std::string& ip : net.Resolve(store_host))
    if (!IsLoopbackIp(ip) && !Contains(local, ip)) return ip;
  return "";
}

Status LoopbackRefused(const std::string& what, const std::string& store_host) {
  return Status(DYAD_RC_BADREQUEST,
                what + ", but the metadata store (" + store_host +
                    ") is on another host, so peers there could not reach this service: give "
                    "--advertise HOST:PORT (or DYAD_SERVICE_ADVERTISE) with an address of this "
                    "host that the other nodes can reach, and listen on it or on 0.0.0.0");
}

}  // namespace

const NetView& SystemNetView() {
  static const SystemView view;
  return view;
}

bool IsLoopbackIp(const std::string& ip) { return ip.rfind("127.", 0) == 0; }

StoreEndpoint StoreEndpointOf(const std::string& kvs_url) {
  StoreEndpoint ep;
  const size_t scheme = kvs_url.find("://");
  if (scheme == std::string::npos) return ep;  // "embedded", "memory": this process
  std::string rest = kvs_url.substr(scheme + 3);
  rest = rest.substr(0, rest.find_first_of("/?"));
  const size_t at = rest.rfind('@');
  if (at != std::string::npos) rest = rest.substr(at + 1);
  std::string port;
  if (!rest.empty() && rest[0] == '[') {
    const size_t close = rest.find(']');
    if (close == std::string::npos) return ep;
    ep.host = rest.substr(1, close - 1);
    if (close + 1 < rest.size() && rest[close + 1] == ':') port = rest.substr(close + 2);
  } else {
    const size_t colon = rest.rfind(':');
    ep.host = rest.substr(0, colon);
    if (colon != std::string::npos) port = rest.substr(colon + 1);
  }
  if (!port.empty() && port.size() <= 5 &&
      port.find_first_not_of("0123456789") == std::string::npos) {
    const unsigned long p = std::stoul(port);
    if (p <= 65535) ep.port = static_cast<uint16_t>(p);
  }
  return ep;
}

Result<AdvertiseChoice> ChooseAdvertiseAddress(const AdvertiseInput& in, const NetView& net) {
  const std::string port = ":" + std::to_string(in.port);
  const std::string store_ip = RemoteStoreIp(in.store_host, net);
  if (!in.explicit_address.empty()) {
    Result<SocketAddress> a = ParseAddress(in.explicit_address);
    if (!a.ok()) return a.status().Annotate("--advertise");
    if (!store_ip.empty() && AllLoopback(net.Resolve(a->host)))
      return LoopbackRefused("--advertise " + in.explicit_address + " is a loopback address",
                             in.store_host);
    return AdvertiseChoice{in.explicit_address, ""};
  }
  if (!IsWildcard(in.listen_host)) {
    if (!store_ip.empty() && AllLoopback(net.Resolve(in.listen_host)))
      return LoopbackRefused("this service listens on the loopback address " + in.listen_host,
                             in.store_host);
    return AdvertiseChoice{in.listen_host + port, ""};
  }
  const std::vector<std::string> named = net.Resolve(in.hostname);
  if (!store_ip.empty()) {
    const std::string src = net.SourceFor(store_ip);
    if (src.empty() || IsLoopbackIp(src))
      return Status(DYAD_RC_BADREQUEST,
                    "no route from this host to the metadata store at " + in.store_host + " (" +
                        store_ip +
                        ") to choose an address to advertise from: check the "
                        "network, or give --advertise HOST:PORT (or DYAD_SERVICE_ADVERTISE)");
    if (Contains(named, src)) return AdvertiseChoice{in.hostname + port, ""};
    return AdvertiseChoice{src + port, "host name '" + in.hostname + "' resolves to " +
                                           (named.empty() ? std::string("nothing") : Join(named)) +
                                           "; advertising " + src +
                                           ", the address of the interface that routes to "
                                           "the metadata store at " +
                                           in.store_host + " (--advertise overrides)"};
  }
  if (!named.empty() && !AllLoopback(named)) return AdvertiseChoice{in.hostname + port, ""};
  for (const std::string& ip : net.LocalAddresses()) {
    if (IsLoopbackIp(ip)) continue;
    return AdvertiseChoice{
        ip + port, "host name '" + in.hostname + "' resolves to " +
                       (named.empty() ? std::string("nothing") : Join(named)) + "; advertising " +
                       ip +
                       ", the first address of an interface that is up "
                       "(give --advertise HOST:PORT if other nodes reach this one elsewhere)"};
  }
  // A host with nothing but loopback: only services on this host can exist.
  return AdvertiseChoice{(named.empty() ? std::string("127.0.0.1") : in.hostname) + port, ""};
}

}  // namespace dyad
