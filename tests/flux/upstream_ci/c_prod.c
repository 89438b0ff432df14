/* c_prod N DIR: writes N files DIR/data<i>.txt with plain POSIX calls, as
 * upstream's demo producer; DYAD publishes each on close() when the program
 * runs under LD_PRELOAD=libdyad_wrapper.so. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "content.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: c_prod N DIR\n");
    return 2;
  }
  int n = atoi(argv[1]), failed = 0;
  for (int i = 0; i < n; ++i) {
    char path[4096];
    ci_name(path, sizeof path, argv[2], i);
    size_t size = ci_size(i);
    char* buf = malloc(size);
    ci_fill(i, buf);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || write(fd, buf, size) != (ssize_t)size || close(fd) != 0) {
      perror(path);
      failed = 1;
    } else {
      printf("produced %s\n", path);
    }
    free(buf);
  }
  return failed;
}
