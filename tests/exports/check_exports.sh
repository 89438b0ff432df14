#!/bin/sh
# check_exports.sh LIB ALLOWLIST [LIB ALLOWLIST ...]
#
# Fails when a shared library exports a symbol its allow-list does not
# allow, or lacks one the list requires. The dynamic symbol table is read
# with `nm -D --defined-only`; each allow-list line is
#   allow REGEX    (extended regex, matched against the whole mangled name)
#   require NAME   (must be exported; also allowed)
# with # comments. Prints each library's count of exported symbols.
set -eu
status=0
patterns=$(mktemp)
trap 'rm -f "$patterns"' EXIT
while [ $# -ge 2 ]; do
  lib=$1
  list=$2
  shift 2
  names=$(nm -D --defined-only "$lib" | awk 'NF >= 3 { print $3 }' | sort -u)
  sed -n -e 's/^allow[[:space:]]\{1,\}\(.*\)$/^\1$/p' \
         -e 's/^require[[:space:]]\{1,\}\(.*\)$/^\1$/p' "$list" > "$patterns"
  extra=$(printf '%s\n' "$names" | grep -Ev -f "$patterns" | grep -v '^$' || true)
  if [ -n "$extra" ]; then
    echo "$(basename "$lib"): exports symbols outside $(basename "$list"):" >&2
    printf '%s\n' "$extra" | sed 's/^/  /' >&2
    printf '%s\n' "$extra" | c++filt | sed 's/^/  = /' >&2
    status=1
  fi
  for want in $(sed -n 's/^require[[:space:]]\{1,\}\([^[:space:]]*\).*$/\1/p' "$list"); do
    if ! printf '%s\n' "$names" | grep -qx -- "$want"; then
      echo "$(basename "$lib"): does not export $want" >&2
      status=1
    fi
  done
  echo "$(basename "$lib"): $(printf '%s\n' "$names" | grep -c .) exported symbols"
done
exit $status
