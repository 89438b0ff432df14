#!/usr/bin/env python3
"""The bash completions (packaging/bash-completion) against the programs.

usage: check_completion.py BUILD_DIR SOURCE_DIR

Sources each completion script in a real bash, with the build's programs on
PATH, and asks it to complete what a user types: every subcommand of
`dyad --help` and every option of every `--help` (top level and per
subcommand) must be offered, plus the values of -m and -k.
"""

import os
import re
import shlex
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_man import help_items, run  # noqa: E402


def complete_all(script, func, cases):
    """COMPREPLY of `func` for each command line of `cases` (the last word of
    each is being typed), all in one bash that sourced `script`."""
    prog = [f". {shlex.quote(script)}"]
    for words in cases:
        line = " ".join(shlex.quote(w) for w in words)
        prog.append(f"COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; COMPREPLY=(); {func}; "
                    "printf '%s ' \"${COMPREPLY[@]}\"; echo")
    r = subprocess.run(["bash", "--norc", "--noprofile", "-c", "\n".join(prog)],
                       capture_output=True, text=True, timeout=60, check=True)
    lines = r.stdout.split("\n")[:len(cases)]
    return [set(line.split()) for line in lines]


def option_values(help_text):
    """{option: [values]} for the options of dyad-service --help that list
    their values: --mode ("...: A, B, C (default X)"), --kvs (its URL
    schemes and plain names) and --protection (its levels)."""
    out = {}
    for line in help_text.splitlines():
        m = re.match(r"^\s+(?:-\w,)?(--[\w-]+)\S*\s+(.*)$", line)
        if not m:
            continue
        opt, text = m.groups()
        if opt == "--mode":
            lst = re.search(r":\s*([A-Z_]+(?:,\s*[A-Z_]+)*)\s*\(default", text)
            out[opt] = re.findall(r"[A-Z_]+", lst.group(1)) if lst else []
        elif opt == "--kvs":
            desc = text.split(":", 1)[1] if ":" in text else text
            names = re.findall(r"\b([a-z][a-z+]*://)", desc)
            names += [w for w in re.findall(r"(?:^|,)\s*([a-z]+)\s*\(", desc)]
            out[opt] = sorted(set(names))
        elif opt == "--protection":
            out[opt] = re.findall(r"\b(integrity|encrypt|none) \(", text)
    return out


def main():
    build, src = os.path.abspath(sys.argv[1]), sys.argv[2]
    os.environ["PATH"] = build + os.pathsep + os.environ["PATH"]
    comp = os.path.join(src, "packaging", "bash-completion")
    dyad, service = os.path.join(comp, "dyad"), os.path.join(comp, "dyad-service")
    problems = []

    checks = {dyad: [], service: []}  # script -> [(words, wanted)]

    def expect(script, func, words, wanted):
        checks[script].append((words, set(wanted)))

    for script, cmd in ((dyad, "dyad"), (service, "dyad-service")):
        r = subprocess.run(["bash", "--norc", "-c", f". {shlex.quote(script)}; complete -p {cmd}"],
                           capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            problems.append(f"{script} does not register a completion for {cmd}")

    service_help = run("dyad-service", "--help")
    opts, _, _ = help_items(service_help)
    for o in opts:
        expect(service, "_dyad_service", ["dyad-service", o], [o])
    # The values of every option whose --help line lists them: the
    # transports of -m, the stores of -k, the levels of --protection.
    values = option_values(service_help)
    if len(values.get("--mode", [])) < 3:
        problems.append(f"dyad-service --help: parsed the modes {values.get('--mode')}")
    for o in ("--mode", "--kvs", "--protection"):
        if not values.get(o):
            problems.append(f"dyad-service --help: no values parsed for {o}")
    for o, vals in values.items():
        short = {"--mode": "-m", "--kvs": "-k"}.get(o)
        for flag in [o] + ([short] if short else []):
            expect(service, "_dyad_service", ["dyad-service", flag, ""], vals)
    # `dyad demo --mode` takes the same transports.
    expect(dyad, "_dyad", ["dyad", "demo", "--mode", ""], values.get("--mode", []))

    opts, _, subs = help_items(run("dyad", "--help"))
    expect(dyad, "_dyad", ["dyad", ""], subs)
    expect(dyad, "_dyad", ["dyad", "--socket", "/tmp/s", ""], subs)
    for o in opts:
        expect(dyad, "_dyad", ["dyad", o], [o])
    for sub in subs:
        sub_opts, _, _ = help_items(run("dyad", sub, "--help"))
        for o in sub_opts:
            expect(dyad, "_dyad", ["dyad", sub, o], [o])
    expect(dyad, "_dyad", ["dyad", "ls", "--json", "--"], ["--limit"])

    for script, func in ((dyad, "_dyad"), (service, "_dyad_service")):
        cases = checks[script]
        for (words, wanted), got in zip(cases, complete_all(script, func, [w for w, _ in cases])):
            if wanted - got:
                problems.append(f"completing {words}: {sorted(wanted - got)} not offered "
                                f"(got {sorted(got)})")
    ls_offer = complete_all(dyad, "_dyad", [["dyad", "ls", "--json", "--"]])[0]
    if "--version" in ls_offer:
        problems.append("dyad ls --: offered the top-level options instead of ls's")

    for p in problems:
        print("check_completion:", p, file=sys.stderr)
    if problems:
        return 1
    print("bash completion offers every subcommand and option")
    return 0


if __name__ == "__main__":
    sys.exit(main())
