"""python/cmake/site_dir.py: where `make install` puts pydyad for a prefix."""

import os
import subprocess
import sys
import sysconfig

import pytest

SITE_DIR = os.path.join(os.path.dirname(__file__), os.pardir, "cmake", "site_dir.py")


def site_dir(prefix):
    out = subprocess.run([sys.executable, SITE_DIR, prefix], capture_output=True, text=True,
                         timeout=30, check=True).stdout.split("\n")
    return out[0], out[1]


def test_default_prefix_is_searched():
    # The prefix this interpreter installs to by default (/usr/local for
    # Debian's python3): pydyad installed there imports without PYTHONPATH.
    prefix = sysconfig.get_path("data")
    rel, searched = site_dir(prefix)
    assert searched == "searched", (prefix, rel)
    assert os.path.join(prefix, rel) in [os.path.normpath(p) for p in sys.path]
    assert len(rel.split("/")) == 3  # the extension's RUNPATH relies on it


@pytest.mark.skipif(sysconfig.get_default_scheme() != "posix_local",
                    reason="Debian's interpreter layout")
def test_debian_system_prefixes():
    assert site_dir("/usr/local") == (f"lib/python{sys.version_info[0]}.{sys.version_info[1]}"
                                      "/dist-packages", "searched")
    assert site_dir("/usr") == ("lib/python3/dist-packages", "searched")


def test_other_prefix_needs_pythonpath(tmp_path):
    rel, searched = site_dir(str(tmp_path / "opt" / "dyad"))
    assert searched == "not-searched"
    assert rel == f"lib/python{sys.version_info[0]}.{sys.version_info[1]}/site-packages"
