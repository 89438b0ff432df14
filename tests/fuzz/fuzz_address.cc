// Fuzz target: address parsing (common/net.cc ParseAddress): "HOST:PORT",
// "unix:/path", "/path". What parses must print back to a string that
// parses to the same address. No name is resolved here.
#include <string>

#include "common/net.h"
#include "fuzz/fuzz_util.h"

using namespace dyad;
using dyad::fuzz::Check;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  Result<SocketAddress> a = ParseAddress(text);
  if (!a.ok()) {
    Check(a.status().code() == DYAD_RC_BADREQUEST);
    return 0;
  }
  Result<SocketAddress> b = ParseAddress(a->ToString());
  Check(b.ok());
  Check(b->is_unix == a->is_unix && b->host == a->host && b->port == a->port);
  return 0;
}
