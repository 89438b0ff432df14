#!/bin/sh
# check_format.sh SRC_DIR: every C and C++ source of the project is formatted
# as .clang-format says (clang-format --dry-run -Werror). Lists the files
# that are not, with the command that formats them. Exit 77 (skipped) when
# clang-format is missing; scripts/install-deps.sh installs it.
set -eu
src=${1:?usage: check_format.sh SRC_DIR}
command -v clang-format >/dev/null 2>&1 || { echo "clang-format not found" >&2; exit 77; }
cd "$src"
files=$(find include src tools tests bench python/src \
             \( -name '*.cc' -o -name '*.h' -o -name '*.hpp' -o -name '*.c' \) \
             -not -path 'tests/fuzz/corpus/*' | sort)
n=$(echo "$files" | wc -l)
# One run over every file; only when it fails, one run per file to name them.
if clang-format --dry-run -Werror $files >/dev/null 2>&1; then
    echo "$n files formatted as .clang-format says"
    exit 0
fi
bad=""
for f in $files; do
    clang-format --dry-run -Werror "$f" >/dev/null 2>&1 || bad="$bad $f"
done
if [ -n "$bad" ]; then
    echo "not formatted as .clang-format says ($(clang-format --version)):" >&2
    for f in $bad; do echo "  $f" >&2; done
    echo "format them with: clang-format -i$bad" >&2
    exit 1
fi
echo "$n files formatted as .clang-format says"
