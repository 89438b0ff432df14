"""dyad_open modes and the h5py DyadFile round trip across two nodes."""

import os

import pytest

import pydyad
from pydyad.context import mode_reads_existing, mode_writes


@pytest.mark.parametrize("mode,reads,writes", [
    ("r", True, False), ("rb", True, False), ("rt", True, False),
    ("r+", True, True), ("r+b", True, True),
    ("w", False, True), ("wb", False, True), ("w+", False, True),
    ("a", False, True), ("ab", False, True), ("x", False, True), ("xb", False, True),
    ("w-", False, True),  # h5py's exclusive create
])
def test_mode_parsing(mode, reads, writes):
    assert mode_reads_existing(mode) is reads
    assert mode_writes(mode) is writes


@pytest.mark.parametrize("mode,data", [("w", "text"), ("wb", b"binary"), ("x", "excl"),
                                       ("a", "append"), ("w+", "plus")])
def test_dyad_open_write_then_remote_read(cluster, nodes, unique, mode, data):
    name = f"{unique}.{mode.replace('+', 'p')}"
    nodes.run(0, f"""
        import os, pydyad
        p = os.path.join(os.environ["DYAD_PATH_PRODUCER"], {name!r})
        with pydyad.dyad_open(p, {mode!r}) as f:
            f.write({data!r})
    """)
    rmode = "rb" if isinstance(data, bytes) else "r"
    out = nodes.run(1, f"""
        import os, pydyad
        p = os.path.join(os.environ["DYAD_PATH_CONSUMER"], {name!r})
        with pydyad.dyad_open(p, mode={rmode!r}) as f:
            print(repr(f.read()))
    """, DYAD_CONSUME_TIMEOUT=20).stdout
    assert out.strip() == repr(data)


def test_dyad_open_with_metadata_and_explicit_ctx(cluster, nodes, node1, unique):
    name = f"{unique}.md"
    nodes.run(0, f"""
        import os, pydyad
        d = pydyad.Dyad(); d.init_env()
        with pydyad.dyad_open(os.path.join(os.environ["DYAD_PATH_PRODUCER"], {name!r}), "w",
                              dyad_ctx=d, register_dyad_ctx=True) as f:
            f.write("hello")
    """)
    cons = os.path.join(cluster.cons_dir(1), name)
    md = node1.get_metadata(cons, should_wait=True, raw=True)
    with pydyad.dyad_open(cons, "r", dyad_ctx=node1, metadata_wrapper=md) as f:
        assert f.read() == "hello"
    md.free()


def test_dyad_open_does_not_publish_on_error(cluster, node1, unique):
    prod = os.path.join(cluster.prod_dir(1), unique)
    with pytest.raises(ZeroDivisionError):
        with pydyad.dyad_open(prod, "w", dyad_ctx=node1) as f:
            f.write("partial")
            1 / 0
    assert f.closed
    assert node1.get_metadata(os.path.join(cluster.cons_dir(1), unique)) is None


def test_dyad_open_plain_path(node1, tmp_path):
    p = tmp_path / "plain.txt"
    with pydyad.dyad_open(str(p), "w", dyad_ctx=node1) as f:
        f.write("x")
    with pydyad.dyad_open(file=str(p), dyad_ctx=node1) as f:
        assert f.read() == "x"


def test_hdf5_round_trip(cluster, nodes, unique):
    pytest.importorskip("h5py")
    pytest.importorskip("numpy")
    name = f"{unique}.h5"
    nodes.run(0, f"""
        import os, numpy as np
        from pydyad.hdf import DyadFile
        p = os.path.join(os.environ["DYAD_PATH_PRODUCER"], {name!r})
        with DyadFile(p, "w") as f:
            f.create_dataset("x", data=np.arange(1000, dtype="f8").reshape(10, 100))
            f.attrs["step"] = 7
    """)
    out = nodes.run(1, f"""
        import os, numpy as np, pydyad
        from pydyad.hdf import DyadFile
        p = os.path.join(os.environ["DYAD_PATH_CONSUMER"], {name!r})
        with DyadFile(p, "r") as f:
            x = f["x"][...]
            assert isinstance(f, __import__("h5py").File)
            print(int(f.attrs["step"]), float(x.sum()), x.shape)
    """, DYAD_CONSUME_TIMEOUT=20).stdout
    assert out.strip().split(None, 2) == ["7", str(float(sum(range(1000)))), "(10, 100)"]


def test_hdf5_read_times_out_when_unpublished(cluster, nodes, unique):
    pytest.importorskip("h5py")
    out = nodes.run(1, f"""
        import os, pydyad
        from pydyad.hdf import DyadFile
        try:
            DyadFile(os.path.join(os.environ["DYAD_PATH_CONSUMER"], {unique!r}), "r")
        except pydyad.DyadError as e:
            print(e.name)
    """, DYAD_CONSUME_TIMEOUT=1).stdout
    assert out.strip() == "DYAD_RC_TIMEOUT"


def test_dyad_open_under_the_preload_library(cluster, nodes, unique):
    """A pydyad program run with LD_PRELOAD set as well (a job script that sets
    it for every step): dyad_open's producer lock on the file the library
    already holds locked for the process is granted at once, instead of
    waiting for its own process until the lock bound (DYAD_RPC_TIMEOUT)."""
    wrapper = os.path.join(os.environ["DYAD_BUILD_DIR"], "libdyad_wrapper.so")
    if not os.path.exists(wrapper):
        pytest.skip("libdyad_wrapper.so not built")
    name = f"{unique}.preload"
    nodes.run(0, f"""
        import os, pydyad
        p = os.path.join(os.environ["DYAD_PATH_PRODUCER"], {name!r})
        with pydyad.dyad_open(p, "w") as f:
            f.write("under the preload library")
    """, timeout=20, LD_PRELOAD=wrapper, DYAD_RPC_TIMEOUT=60)
    out = nodes.run(1, f"""
        import os, pydyad
        p = os.path.join(os.environ["DYAD_PATH_CONSUMER"], {name!r})
        with pydyad.dyad_open(p, "r") as f:
            print(f.read())
    """, timeout=20, LD_PRELOAD=wrapper, DYAD_CONSUME_TIMEOUT=15).stdout
    assert out.strip() == "under the preload library"
