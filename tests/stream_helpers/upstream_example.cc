// upstream_example.cc: a program written for upstream DYAD's C++ streams,
// kept in upstream's style on purpose (only upstream's names are used).
// Building it proves source compatibility; the stream tests also run it.
//
//   dyad_stream_upstream_example produce PATH   writes "hello dyad 42"
//   dyad_stream_upstream_example consume PATH   reads it back, exit 0 if equal
#include <dyad/stream/dyad_stream_api.hpp>

#include <iostream>
#include <string>

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  const std::string role = argv[1];
  const std::string path = argv[2];

  dyad::dyad_stream_core core;
  core.init();
  std::cout << "producer=" << core.is_dyad_producer() << " consumer=" << core.is_dyad_consumer()
            << std::endl;

  if (role == "produce") {
    dyad::ofstream_dyad ofs(path);
    ofs.get_stream() << "hello dyad " << 42 << std::endl;
    ofs.close();
    const bool ok = static_cast<bool>(ofs.get_stream());
    std::cout << (ok ? "ok" : "failed") << std::endl;
    return ok ? 0 : 1;
  }
  dyad::ifstream_dyad ifs(path, std::ios_base::in);
  std::string a, b;
  int n = 0;
  ifs.get_stream() >> a >> b >> n;
  ifs.close();
  const bool ok = a == "hello" && b == "dyad" && n == 42;
  std::cout << (ok ? "ok" : "mismatch") << std::endl;
  return ok ? 0 : 1;
}
