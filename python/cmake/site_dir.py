"""Where a Python package belongs under an install prefix, for this interpreter.

Usage: site_dir.py PREFIX
Prints two lines: the platform-library directory relative to PREFIX, and
"searched" when this interpreter imports from it without PYTHONPATH, else
"not-searched".

The scheme is the one of sysconfig whose data directory is PREFIX: on
Debian that is posix_local for /usr/local (.../lib/python3.X/dist-packages,
searched) and deb_system for /usr (/usr/lib/python3/dist-packages,
searched); any other prefix gets CPython's standard layout
(PREFIX/lib/python3.X/site-packages), which needs PYTHONPATH.
"""

import os
import sys
import sysconfig


def norm(path):
    return os.path.normpath(os.path.abspath(path))


def platlib_for(prefix):
    names = sysconfig.get_scheme_names()
    preferred = [sysconfig.get_default_scheme(), "deb_system", "posix_prefix"]
    for scheme in dict.fromkeys(preferred):
        if scheme in names and norm(sysconfig.get_path("data", scheme)) == prefix:
            return norm(sysconfig.get_path("platlib", scheme))
    own = {"base": prefix, "platbase": prefix, "installed_base": prefix,
           "installed_platbase": prefix}
    return norm(sysconfig.get_path("platlib", "posix_prefix", vars=own))


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: site_dir.py PREFIX")
    prefix = norm(sys.argv[1])
    platlib = platlib_for(prefix)
    searched = platlib in {norm(p) for p in sys.path if p}
    print(os.path.relpath(platlib, prefix))
    print("searched" if searched else "not-searched")


if __name__ == "__main__":
    main()
