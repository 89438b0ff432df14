// cpp_client_app.cc: a C++11 program on the public C++ client
// (dyad/client/dyad_client.hpp), built by the install tests from an
// installed prefix only (pkg-config dyad, -Wl,-rpath).
//
//   cpp_client_app produce PATH TEXT   writes TEXT to PATH, then Produce
//   cpp_client_app consume PATH TEXT   Consume, then checks PATH holds TEXT
//                                      and the metadata names a size
//
// Settings come from the DYAD_* environment (Client::FromEnv). Exit status
// 0 on success; a failure prints the client's Status.
#include <dyad/client/dyad_client.hpp>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

namespace {

int Fail(const char* what, const dyad::client::Status& st) {
  std::fprintf(stderr, "cpp_client_app: %s: %s\n", what, st.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: cpp_client_app produce|consume PATH TEXT\n");
    return 2;
  }
  const std::string mode = argv[1], path = argv[2], text = argv[3];
  dyad::client::Client client;
  dyad::client::Status st = dyad::client::Client::FromEnv(&client);
  if (!st.ok()) return Fail("FromEnv", st);
  st = client.Ping();
  if (!st.ok()) return Fail("Ping", st);

  if (mode == "produce") {
    {
      std::ofstream out(path.c_str(), std::ios::binary);
      out << text;
      if (!out) {
        std::fprintf(stderr, "cpp_client_app: cannot write %s\n", path.c_str());
        return 1;
      }
    }
    st = client.Produce(path);
    return st.ok() ? 0 : Fail("Produce", st);
  }
  if (mode != "consume") {
    std::fprintf(stderr, "cpp_client_app: unknown mode %s\n", mode.c_str());
    return 2;
  }
  dyad::client::ConsumeInfo info;
  st = client.Consume(path, &info);
  if (!st.ok()) return Fail("Consume", st);
  std::ifstream in(path.c_str(), std::ios::binary);
  std::ostringstream got;
  got << in.rdbuf();
  if (got.str() != text) {
    std::fprintf(stderr, "cpp_client_app: %s holds other bytes than produced\n", path.c_str());
    return 1;
  }
  dyad::client::Metadata md;
  st = client.GetMetadata(path, false, &md);
  if (!st.ok()) return Fail("GetMetadata", st);
  if (md.size != text.size()) {
    std::fprintf(stderr, "cpp_client_app: metadata size %llu, expected %zu\n",
                 static_cast<unsigned long long>(md.size), text.size());
    return 1;
  }
  std::printf("ok\n");
  return 0;
}
