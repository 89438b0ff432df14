/* old_stat.c: dyad-preload-oldstat, a program that looks at files the way a
   program built against a C library older than glibc 2.33 does. Such a
   library's stat, lstat and fstatat were inline wrappers around __xstat,
   __lxstat and __fxstatat (and their 64-bit forms), so the old program's
   references are to those symbols at their original versions
   (__xstat@GLIBC_2.2.5, __fxstatat@GLIBC_2.4 on x86_64). The .symver
   directives below make this program's references exactly those: under
   LD_PRELOAD they bind to libdyad_wrapper.so's definitions as an old
   binary's do (tests/integration/preload_test.cc checks that with
   LD_DEBUG=bindings). A lookup with dlvsym() would not: it asks for the
   version explicitly and skips the preload library's unversioned
   definitions.

     dyad-preload-oldstat OP PATH [OP PATH]...
       OP: xstat, xstat64, lxstat, lxstat64, fxstatat, fxstatat64 (the
       "at" forms with a descriptor of PATH's directory and its last
       component), or badver (__xstat with a version number no C library
       knows: the real function must see it and refuse it with EINVAL).
       Prints one line per pair: "OP rc=R errno=E size=S", E "kept" when a
       successful call left errno as it was, S -1 after a failure.

   Builds only where the C library has these symbols (the CMake check
   compiles this very file). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__x86_64__) && !defined(__ILP32__)
#define OLD_XSTAT_VERSION "GLIBC_2.2.5"
#define OLD_FXSTATAT_VERSION "GLIBC_2.4"
#define OLD_STAT_VER 1 /* _STAT_VER_LINUX, what the old inline wrappers passed */
#elif defined(__aarch64__)
#define OLD_XSTAT_VERSION "GLIBC_2.17"
#define OLD_FXSTATAT_VERSION "GLIBC_2.17"
#define OLD_STAT_VER 0 /* _STAT_VER_KERNEL */
#else
#error "no known pre-2.33 stat entry points for this architecture"
#endif

extern int old_xstat(int ver, const char* path, struct stat* buf);
extern int old_xstat64(int ver, const char* path, struct stat64* buf);
extern int old_lxstat(int ver, const char* path, struct stat* buf);
extern int old_lxstat64(int ver, const char* path, struct stat64* buf);
extern int old_fxstatat(int ver, int dirfd, const char* path, struct stat* buf, int flags);
extern int old_fxstatat64(int ver, int dirfd, const char* path, struct stat64* buf, int flags);
__asm__(".symver old_xstat, __xstat@" OLD_XSTAT_VERSION);
__asm__(".symver old_xstat64, __xstat64@" OLD_XSTAT_VERSION);
__asm__(".symver old_lxstat, __lxstat@" OLD_XSTAT_VERSION);
__asm__(".symver old_lxstat64, __lxstat64@" OLD_XSTAT_VERSION);
__asm__(".symver old_fxstatat, __fxstatat@" OLD_FXSTATAT_VERSION);
__asm__(".symver old_fxstatat64, __fxstatat64@" OLD_FXSTATAT_VERSION);

/* The errno values the test tells apart, by name; others as numbers. */
static const char* ErrnoName(int e, int marker) {
  static char other[32];
  if (e == marker) return "unset";
  switch (e) {
    case ENOENT:
      return "ENOENT";
    case EINVAL:
      return "EINVAL";
    case ENOSYS:
      return "ENOSYS";
    case EIO:
      return "EIO";
    default:
      snprintf(other, sizeof(other), "%d", e);
      return other;
  }
}

/* A descriptor of the directory of `path` and its last component. */
static int OpenParent(const char* path, const char** last) {
  const char* slash = strrchr(path, '/');
  if (slash == NULL) {
    *last = path;
    return AT_FDCWD;
  }
  *last = slash + 1;
  size_t n = (size_t)(slash - path);
  char* dir = malloc(n + 2);
  if (dir == NULL) return -1;
  if (n == 0) {
    strcpy(dir, "/");
  } else {
    memcpy(dir, path, n);
    dir[n] = '\0';
  }
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  free(dir);
  return fd;
}

int main(int argc, char** argv) {
  if (argc < 3 || argc % 2 != 1) {
    fprintf(stderr, "usage: %s OP PATH [OP PATH]...\n", argv[0]);
    return 2;
  }
  int status = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const char* op = argv[i];
    const char* path = argv[i + 1];
    struct stat st;
    struct stat64 st64;
    long long size = -1;
    int rc;
    int dirfd = AT_FDCWD;
    const char* last = path;
    const int marker = 4242; /* no errno value: tells a kept errno */
    if (strcmp(op, "fxstatat") == 0 || strcmp(op, "fxstatat64") == 0) {
      dirfd = OpenParent(path, &last);
      if (dirfd == -1) {
        printf("%s cannot open the directory of %s: %s\n", op, path, strerror(errno));
        status = 1;
        continue;
      }
    }
    errno = marker;
    if (strcmp(op, "xstat") == 0) {
      rc = old_xstat(OLD_STAT_VER, path, &st);
      size = st.st_size;
    } else if (strcmp(op, "xstat64") == 0) {
      rc = old_xstat64(OLD_STAT_VER, path, &st64);
      size = st64.st_size;
    } else if (strcmp(op, "lxstat") == 0) {
      rc = old_lxstat(OLD_STAT_VER, path, &st);
      size = st.st_size;
    } else if (strcmp(op, "lxstat64") == 0) {
      rc = old_lxstat64(OLD_STAT_VER, path, &st64);
      size = st64.st_size;
    } else if (strcmp(op, "fxstatat") == 0) {
      rc = old_fxstatat(OLD_STAT_VER, dirfd, last, &st, 0);
      size = st.st_size;
    } else if (strcmp(op, "fxstatat64") == 0) {
      rc = old_fxstatat64(OLD_STAT_VER, dirfd, last, &st64, 0);
      size = st64.st_size;
    } else if (strcmp(op, "badver") == 0) {
      rc = old_xstat(12345, path, &st);
      size = st.st_size;
    } else {
      fprintf(stderr, "%s: unknown OP %s\n", argv[0], op);
      return 2;
    }
    const int e = errno;
    if (dirfd >= 0) close(dirfd);
    if (rc != 0) size = -1;
    if (rc == 0 && e == marker)
      printf("%s rc=%d errno=kept size=%lld\n", op, rc, size);
    else
      printf("%s rc=%d errno=%s size=%lld\n", op, rc, ErrnoName(e, marker), size);
  }
  return status;
}
