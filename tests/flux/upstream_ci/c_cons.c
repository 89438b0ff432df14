/* c_cons N DIR: opens DIR/data<i>.txt for i < N with plain POSIX calls (under
 * LD_PRELOAD=libdyad_wrapper.so each open() waits for the file's publication
 * and its transfer), checks the bytes, and prints "OK" per good file, as
 * upstream's demo consumer. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "content.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: c_cons N DIR\n");
    return 2;
  }
  int n = atoi(argv[1]), bad = 0;
  for (int i = 0; i < n; ++i) {
    char path[4096];
    ci_name(path, sizeof path, argv[2], i);
    size_t size = ci_size(i);
    char* want = malloc(size);
    char* got = malloc(size + 1);
    ci_fill(i, want);
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
      perror(path);
      bad++;
    } else {
      size_t have = 0;
      ssize_t r;
      while (have < size + 1 && (r = read(fd, got + have, size + 1 - have)) > 0) have += (size_t)r;
      close(fd);
      if (have == size && memcmp(got, want, size) == 0) {
        printf("OK\n");
      } else {
        printf("BAD %s (%zu bytes, expected %zu)\n", path, have, size);
        bad++;
      }
    }
    fflush(stdout);
    free(want);
    free(got);
  }
  return bad != 0;
}
