/* content.h: the bytes of file i of the upstream-style CI programs (c_prod,
 * c_cons, cpp_prod, cpp_cons): "data<i>.txt" holds 200 + 37*i letters and
 * a newline, different for every file, so a consumer that got the wrong
 * file, a short one or a torn one says so. */
#ifndef DYAD_TESTS_UPSTREAM_CI_CONTENT_H
#define DYAD_TESTS_UPSTREAM_CI_CONTENT_H

#include <stdio.h>
#include <stdlib.h>

static size_t ci_size(int i) { return 200 + 37 * (size_t)i + 1; }

/* Fills buf (ci_size(i) bytes) with file i's content. */
static void ci_fill(int i, char* buf) {
  size_t n = ci_size(i);
  for (size_t k = 0; k + 1 < n; ++k) buf[k] = (char)('a' + (size_t)(i * 7 + k) % 26);
  buf[n - 1] = '\n';
}

static void ci_name(char* out, size_t cap, const char* dir, int i) {
  snprintf(out, cap, "%s/data%d.txt", dir, i);
}

#endif
