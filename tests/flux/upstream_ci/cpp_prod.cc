// cpp_prod N DIR: writes N files DIR/data<i>.txt through dyad::ofstream_dyad
// (each published when its stream closes), as upstream's C++ demo producer.
#include <dyad/stream/dyad_stream_api.hpp>

#include <iostream>
#include <string>
#include <vector>

#include "content.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: cpp_prod N DIR" << std::endl;
    return 2;
  }
  const int n = std::atoi(argv[1]);
  int failed = 0;
  for (int i = 0; i < n; ++i) {
    char path[4096];
    ci_name(path, sizeof path, argv[2], i);
    std::vector<char> buf(ci_size(i));
    ci_fill(i, buf.data());
    dyad::ofstream_dyad ofs(path);
    ofs.get_stream().write(buf.data(), static_cast<std::streamsize>(buf.size()));
    ofs.close();
    if (!ofs.get_stream()) {
      std::cerr << "cpp_prod: writing " << path << " failed" << std::endl;
      failed = 1;
    } else {
      std::cout << "produced " << path << std::endl;
    }
  }
  return failed;
}
