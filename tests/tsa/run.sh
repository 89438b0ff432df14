#!/bin/sh
# run.sh BUILD_DIR SRC_DIR [JOBS]: clang's thread-safety analysis over every
# .cc file under src/, compiled as the build compiles it (the flags come from
# BUILD_DIR/compile_commands.json; GCC-only flags clang rejects are dropped).
# Any -Wthread-safety warning fails the test: a member read or written
# without the mutex its GUARDED_BY names, a REQUIRES helper called without
# it, a lock released twice. The annotations are in
# src/common/thread_annotations.h. Exit 77 (skipped) when clang++-16 is
# missing; scripts/install-deps.sh installs it with the test set.
# DYAD_TSA_ONLY=REGEX checks only the src/ files whose path matches it.
#
# A file that includes no annotated header (no thread_annotations.h among
# the dependencies the compiler recorded for it in BUILD_DIR) has nothing
# the analysis could report, and is skipped; a file without an up-to-date
# dependency record is checked. DYAD_TSA_ALL=1 checks every file.
set -eu
build=${1:?usage: run.sh BUILD_DIR SRC_DIR [JOBS]}
src=${2:?usage: run.sh BUILD_DIR SRC_DIR [JOBS]}
jobs=${3:-2}
clang=${DYAD_TSA_CLANG:-clang++-16}
command -v "$clang" >/dev/null 2>&1 || {
    echo "skipped: $clang not found (scripts/install-deps.sh test installs clang-16)" >&2
    exit 77
}
db=$build/compile_commands.json
[ -f "$db" ] || { echo "no $db (configure with CMAKE_EXPORT_COMPILE_COMMANDS=ON)" >&2; exit 1; }
src=$(cd "$src" && pwd)
list=$(mktemp -d "${TMPDIR:-/tmp}/dyad-tsa.XXXXXX")
trap 'rm -rf "$list"' EXIT INT TERM
# One line per src/ translation unit: the directory to run in, then the
# command with the output and GCC-only flags removed and the analysis added.
python3 - "$db" "$src" "$list/cmds" "${DYAD_TSA_ONLY:-}" "${DYAD_TSA_ALL:-0}" <<'PY'
import json, os, re, shlex, sys
db, src, out, only, check_all = sys.argv[1:6]


def may_annotate(directory, obj, path):
    """False only when the compiler's record of `path`'s dependencies is
    newer than every file in it and names no thread_annotations.h."""
    if check_all != "0" or not obj:
        return True
    dep = os.path.join(directory, obj + ".d")
    try:
        with open(dep) as f:
            text = f.read()
        since = os.stat(dep).st_mtime
    except OSError:
        return True
    if "thread_annotations.h" in text:
        return True
    for word in text.replace("\\\n", " ").split():
        if word.endswith(":") or word == "\\":
            continue
        try:
            if os.stat(os.path.join(directory, word)).st_mtime > since:
                return True
        except OSError:
            return True
    return False


gcc_only = ("-fno-semantic-interposition", "-fconcepts-diagnostics-depth",
            "-fstack-clash-protection", "-fcf-protection", "-Wno-stringop",
            "-Wno-maybe-uninitialized", "-Wno-class-memaccess", "-fmax-errors",
            "-Wno-psabi", "-Wno-dangling-reference", "-Wno-interference-size")
seen = set()
skipped = 0
with open(db) as f, open(out, "w") as o:
    for e in json.load(f):
        path = os.path.normpath(os.path.join(e["directory"], e["file"]))
        if not path.startswith(os.path.join(src, "src") + os.sep) or path in seen:
            continue
        if only and not re.search(only, path):
            continue
        seen.add(path)
        args = e.get("arguments") or shlex.split(e["command"])
        keep, skip, obj = [], False, e.get("output", "")
        for a in args[1:]:
            if skip:
                if skip == "-o":
                    obj = a
                skip = False
                continue
            if a in ("-o", "-MF", "-MT", "-MQ"):
                skip = a
                continue
            if a in ("-c", path, e["file"]) or a.startswith(gcc_only):
                continue
            keep.append(a)
        # (after the build's own -W flags, so only the analysis speaks)
        cmd = keep + ["-fsyntax-only", "-ferror-limit=0", "-Wno-everything", "-Wthread-safety",
                      "-Wthread-safety-reference", "-Werror=thread-safety",
                      "-Werror=thread-safety-reference", path]
        if not may_annotate(e["directory"], obj, path):
            skipped += 1
            continue
        o.write(e["directory"] + "\t" + shlex.join(cmd) + "\n")
with open(out + ".skipped", "w") as o:
    o.write("%d\n" % skipped)
PY
skipped=$(cat "$list/cmds.skipped")
n=$(wc -l <"$list/cmds")
[ "$((n + skipped))" -gt 0 ] || { echo "no src/ files in $db" >&2; exit 1; }
# First, that the analysis is on: unguarded.cc breaks the rules once per
# line marked EXPECT, and each must be reported (as an error).
probe=$(cd "$src" && "$clang" -std=c++17 -fsyntax-only -ferror-limit=0 -Isrc -Wthread-safety \
        -Werror=thread-safety tests/tsa/unguarded.cc 2>&1 || true)
want=$(grep -c 'EXPECT:' "$src/tests/tsa/unguarded.cc")
grep -n 'EXPECT:' "$src/tests/tsa/unguarded.cc" | while IFS= read -r line; do
    no=${line%%:*}
    what=${line#*EXPECT: }
    printf "%s\n" "$probe" | grep -q "unguarded.cc:$no:.*error: $what" || {
        echo "the analysis did not report line $no of tests/tsa/unguarded.cc ($what):" >&2
        printf "%s\n" "$probe" >&2
        exit 1
    }
done
got=$(printf "%s\n" "$probe" | grep -c 'error:' || true)
[ "$got" -eq "$want" ] || {
    echo "tests/tsa/unguarded.cc: $got errors, expected $want:" >&2
    printf "%s\n" "$probe" >&2
    exit 1
}
# Each file on its own; the failures are collected, not interleaved.
export clang list
tr '\n' '\0' <"$list/cmds" | xargs -0 -P "$jobs" -n 1 sh -c '
    dir=$(printf "%s" "$1" | cut -f1); cmd=$(printf "%s" "$1" | cut -f2-)
    f=$(printf "%s" "$cmd" | awk "{print \$NF}")
    if ! out=$(cd "$dir" && eval "\"\$clang\" $cmd" 2>&1); then
        printf "%s\n" "$out" >"$list/fail.$(printf "%s" "$f" | tr / _)"
    fi' sh
fails=$(ls "$list" | grep -c '^fail\.' || true)
if [ "$fails" -gt 0 ]; then
    cat "$list"/fail.* >&2
    echo "thread-safety analysis: $fails of $n src/ files fail ($("$clang" --version | head -1))" >&2
    exit 1
fi
echo "thread-safety analysis: $n src/ files clean, $skipped without an annotated header skipped ($("$clang" --version | head -1))"
