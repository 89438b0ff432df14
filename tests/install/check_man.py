#!/usr/bin/env python3
"""The man pages against the programs' own --help.

usage: check_man.py BUILD_DIR SOURCE_DIR

Fails when an option or positional that `dyad-service --help` shows is not
in dyad-service(8); when a subcommand of `dyad --help`, or an option or
positional of `dyad SUBCOMMAND --help`, is not in dyad(1) (a subcommand's
options must be in its own section); when a configuration variable of
`dyad info --json` is missing from the page of the program that reads it;
or when groff warns about a page.
"""

import json
import os
import re
import shutil
import subprocess
import sys

OPTION_LINE = re.compile(r"^\s+(-\w)?,?(--[\w-]+)?")
SECTION = re.compile(r"^(\w[\w ]*):\s*$")


def run(*cmd):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=True).stdout


def help_items(text):
    """(options, positionals, subcommands) listed by a --help text."""
    options, positionals, subcommands = set(), set(), []
    section = None
    for line in text.splitlines():
        m = SECTION.match(line)
        if m:
            section = m.group(1)
            continue
        if not line.startswith("  ") or line.startswith("    "):
            continue  # not an entry (a wrapped description, or prose)
        word = line.split()[0]
        if section == "Subcommands":
            subcommands.append(word)
        elif section == "Positionals":
            positionals.add(word)
        elif word.startswith("-"):
            m = OPTION_LINE.match(line)
            options.update(g for g in m.groups() if g)
    return options, positionals, subcommands


def page_text(path):
    """The page's source with comments, font escapes and \\- removed."""
    lines = [l for l in open(path, encoding="utf-8").read().splitlines()
             if not l.startswith('.\\"')]
    text = "\n".join(lines)
    text = re.sub(r"\\f(\[[^]]*\]|.)", "", text)
    return text.replace("\\-", "-").replace("\\e", "\\")


def sections(text):
    """{heading: body} of the page's .SS subsections."""
    out, name = {}, None
    for line in text.splitlines():
        if line.startswith(".SS") or line.startswith(".SH"):
            name = line[3:].strip().strip('"') if line.startswith(".SS") else None
            if name is not None:
                out[name] = ""
        elif name is not None:
            out[name] += line + "\n"
    return out


def mentions(text, word):
    return re.search(r"(?<![\w-])" + re.escape(word) + r"(?![\w-])", text) is not None


def main():
    build, src = sys.argv[1], sys.argv[2]
    man = os.path.join(src, "docs", "man")
    problems = []

    def require(text, words, where):
        for w in sorted(words):
            if not mentions(text, w):
                problems.append(f"{where}: '{w}' is shown by --help but missing from the page")

    service_page = page_text(os.path.join(man, "dyad-service.8"))
    opts, pos, _ = help_items(run(os.path.join(build, "dyad-service"), "--help"))
    if len(opts) < 10:
        problems.append(f"dyad-service --help: parsed only {sorted(opts)}")
    require(service_page, opts | pos, "dyad-service(8)")

    dyad = os.path.join(build, "dyad")
    dyad_page = page_text(os.path.join(man, "dyad.1"))
    opts, pos, subs = help_items(run(dyad, "--help"))
    if not subs:
        problems.append("dyad --help: no subcommands parsed")
    require(dyad_page, opts | pos, "dyad(1)")
    subsections = sections(dyad_page)
    for sub in subs:
        body = next((b for h, b in subsections.items() if h.split()[:2] == ["dyad", sub]), None)
        if body is None:
            problems.append(f"dyad(1): no section 'dyad {sub}' for the subcommand")
            continue
        sub_opts, sub_pos, _ = help_items(run(dyad, sub, "--help"))
        sub_opts -= {"-h", "--help"}  # documented once, for every subcommand
        require(body, sub_opts | sub_pos, f"dyad(1), section 'dyad {sub}'")

    for entry in json.loads(run(dyad, "info", "--json"))["config"]:
        # "tests": harness settings (emulator, test servers), not the commands'.
        pages = {"service": [service_page], "client": [dyad_page],
                 "both": [service_page, dyad_page], "tests": []}[entry["used_by"]]
        for text in pages:
            if not mentions(text, entry["name"]):
                page = "dyad-service(8)" if text is service_page else "dyad(1)"
                problems.append(f"{page}: variable {entry['name']} ({entry['used_by']}) missing")

    groff = shutil.which("groff")
    if groff:
        for page in ("dyad.1", "dyad-service.8"):
            r = subprocess.run([groff, "-man", "-ww", "-z", os.path.join(man, page)],
                               capture_output=True, text=True, timeout=30)
            if r.returncode != 0 or r.stderr.strip():
                problems.append(f"groff warns about {page}: {r.stderr.strip()}")

    for p in problems:
        print("check_man:", p, file=sys.stderr)
    if problems:
        return 1
    print("man pages cover every option, subcommand and variable")
    return 0


if __name__ == "__main__":
    sys.exit(main())
