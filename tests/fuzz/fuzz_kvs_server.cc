// Fuzz target: the embedded metadata store's request handling
// (kvs/embedded/embedded_server.cc) over a fresh in-memory store.
//
// Input: a sequence of requests, each (u16 type, u16 length, payload), run
// in order on one store (so puts are seen by later gets, lists, removes).
// Every request, valid or not, must produce exactly one well-formed reply
// frame on the link, and nothing may crash.
#include <cstring>

#include "common/wire.h"
#include "fuzz/fuzz_util.h"
#include "kvs/embedded/embedded_server.h"
#include "kvs/memory/memory_kvs.h"
#include "proto/protocol.h"

using namespace dyad;
using dyad::fuzz::Check;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto store = std::make_shared<MemoryKvs>();
  // Something to find, so gets, waits and lists reach their success paths.
  Check(store->Put("ns", "key", "value").ok());
  Check(store->Put("ns", "key2", std::string(100, 'v')).ok());
  EmbeddedKvsServer server(store, 1000);
  int fds[2];
  Check(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
  Channel server_end(UniqueFd(fds[0]), Trust::kAuthenticated);
  Channel client_end(UniqueFd(fds[1]), Trust::kAuthenticated);
  // A wait must not block the fuzzer: the "requester" is always gone.
  const CancelFn cancel = [] { return true; };
  size_t pos = 0;
  for (int i = 0; i < 16 && pos + 4 <= size; ++i) {
    uint16_t type, len;
    std::memcpy(&type, data + pos, 2);
    std::memcpy(&len, data + pos + 2, 2);
    pos += 4;
    len = static_cast<uint16_t>(std::min<size_t>(len, size - pos));
    const std::string payload(reinterpret_cast<const char*>(data + pos), len);
    pos += len;
    // Types outside the store's range are what the service would not route
    // here; the server must still refuse them cleanly.
    Check(server.Handle(type, payload, server_end, cancel).ok());
    uint16_t rtype = 0;
    std::string reply;
    Check(client_end.RecvFrame(&rtype, &reply, Deadline::AfterMs(1000)).ok());
    Check(rtype == static_cast<uint16_t>(MsgType::kReply));
    Status st;
    std::string body;
    Check(DecodeReply(reply, &st, &body));
  }
  return 0;
}
