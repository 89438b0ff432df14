/* upstream_c_app.c: a C11 program written against upstream DYAD's C API
 * (dyad_client.h, dyad_ctx.h), built by the install tests from an installed
 * prefix only.
 *
 *   upstream_c_app produce PATH TEXT   writes TEXT to PATH, then dyad_produce
 *   upstream_c_app consume PATH TEXT   dyad_consume, then checks PATH holds TEXT
 *
 * Settings come from the DYAD_* environment (dyad_init_env), as upstream.
 * Only upstream's names are used (no dyad_rc_name/dyad_last_error, which
 * are this implementation's additions). Exit status 0 on success. */
#include <dyad/client/dyad_client.h>
#include <dyad/common/dyad_rc.h>
#include <dyad/core/dyad_ctx.h>

#include <stdio.h>
#include <string.h>

static int fail(const char* what, dyad_rc_t rc) {
  fprintf(stderr, "upstream_c_app: %s failed with dyad_rc_t %d\n", what, (int)rc);
  dyad_finalize();
  return 1;
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: upstream_c_app produce|consume PATH TEXT\n");
    return 2;
  }
  const char *path = argv[2], *text = argv[3];
  dyad_rc_t rc = dyad_init_env(DYAD_COMM_RECV, NULL);
  if (DYAD_IS_ERROR(rc)) return fail("dyad_init_env", rc);
  if (strcmp(argv[1], "produce") == 0) {
    FILE* f = fopen(path, "w");
    if (f == NULL || fputs(text, f) < 0 || fclose(f) != 0) {
      perror(path);
      return 1;
    }
    rc = dyad_produce(dyad_ctx_get(), path);
    if (DYAD_IS_ERROR(rc)) return fail("dyad_produce", rc);
  } else {
    char buf[4096] = {0};
    rc = dyad_consume(dyad_ctx_get(), path);
    if (DYAD_IS_ERROR(rc)) return fail("dyad_consume", rc);
    FILE* f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    if (n != strlen(text) || memcmp(buf, text, n) != 0) {
      fprintf(stderr, "upstream_c_app: %s holds '%s', expected '%s'\n", path, buf, text);
      dyad_finalize();
      return 1;
    }
  }
  dyad_finalize();
  printf("ok\n");
  return 0;
}
