// cpp_cons N DIR: reads DIR/data<i>.txt for i < N through dyad::ifstream_dyad
// (each open waits for the publication and the transfer), checks the bytes and
// prints "OK" per good file, as upstream's C++ demo consumer.
#include <dyad/stream/dyad_stream_api.hpp>

#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "content.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: cpp_cons N DIR" << std::endl;
    return 2;
  }
  const int n = std::atoi(argv[1]);
  int bad = 0;
  for (int i = 0; i < n; ++i) {
    char path[4096];
    ci_name(path, sizeof path, argv[2], i);
    std::vector<char> want(ci_size(i));
    ci_fill(i, want.data());
    dyad::ifstream_dyad ifs(path, std::ios_base::in | std::ios_base::binary);
    std::string got((std::istreambuf_iterator<char>(ifs.get_stream())),
                    std::istreambuf_iterator<char>());
    ifs.close();
    if (got.size() == want.size() && got.compare(0, got.size(), want.data(), want.size()) == 0) {
      std::cout << "OK" << std::endl;
    } else {
      std::cout << "BAD " << path << " (" << got.size() << " bytes, expected " << want.size() << ")"
                << std::endl;
      ++bad;
    }
  }
  return bad != 0;
}
