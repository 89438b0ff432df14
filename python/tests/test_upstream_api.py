"""The parts of upstream pydyad's API that its own dyad_open, DyadFile and
DLIO's PyTorch loader use: Dyad.prod_path / cons_path, get_metadata(raw=True)
with a ctypes-like .contents, DTLMode.DYAD_DTL_MARGO, DTLCommMode.DYAD_COMM_END
and DYAD_CHECK_ENV."""

import ctypes
import os
import pathlib

import pytest

import pydyad
from pydyad import DTLCommMode, DTLMode, Dyad
from pydyad.bindings import _dtl_mode_name


def test_enums_and_constants_match_upstream():
    assert pydyad.DYAD_CHECK_ENV == "DYAD_SYNC_HEALTH"
    assert DTLCommMode.DYAD_COMM_END == 3
    assert int(DTLCommMode.DYAD_COMM_END) == len([m for m in DTLCommMode]) - 1
    # Margo's role (RMA pull) is played by the OFI transport here.
    assert DTLMode.DYAD_DTL_MARGO is DTLMode.DYAD_DTL_OFI
    assert _dtl_mode_name(DTLMode.DYAD_DTL_MARGO) == "OFI"
    assert _dtl_mode_name("DYAD_DTL_MARGO") == "OFI"
    assert _dtl_mode_name("margo") == "OFI"


def test_managed_paths_follow_the_context(nodes, cluster):
    # A fresh process: nothing before init, Path objects after, None again
    # after finalize (the context is process-wide).
    out = nodes.run(1, """
        import pydyad
        d = pydyad.Dyad()
        print(d.prod_path, d.cons_path)
        d.init_env()
        print(type(d.prod_path).__name__, d.prod_path)
        print(type(d.cons_path).__name__, d.cons_path)
        print(pydyad.Dyad().cons_path == d.cons_path)
        d.finalize()
        print(d.prod_path, d.cons_path)
    """).stdout.splitlines()
    assert out[0] == "None None"
    assert out[1].split(" ", 1) == ["PosixPath", os.path.abspath(cluster.prod_dir(1))]
    assert out[2].split(" ", 1) == ["PosixPath", os.path.abspath(cluster.cons_dir(1))]
    assert out[3] == "True"
    assert out[4] == "None None"


def test_consumer_only_context_has_no_prod_path(node1, cluster):
    node1.init(reinit=True, kvs_namespace=cluster.namespace,
               cons_managed_path=cluster.cons_dir(1))
    assert node1.prod_path is None
    assert node1.cons_path == pathlib.Path(cluster.cons_dir(1)).absolute()


def test_raw_metadata_contents_like_a_ctypes_pointer(cluster, nodes, node1, unique):
    name = f"{unique}.raw"
    nodes.run(0, f"""
        import os, pydyad
        p = os.path.join(os.environ["DYAD_PATH_PRODUCER"], {name!r})
        with pydyad.dyad_open(p, "wb") as f:
            f.write(b"abc")
    """)
    cons = os.path.join(cluster.cons_dir(1), name)
    raw = node1.get_metadata(cons, should_wait=True, raw=True)
    assert raw  # a non-NULL pointer is true
    assert raw.contents.owner_rank == 0
    assert raw.contents.fpath == name.encode()  # c_char_p gives bytes
    assert raw.contents.size == 3
    node1.free_metadata(raw)
    with pytest.raises(ValueError):
        raw.contents


def test_dlio_loader_pattern(cluster, nodes, unique):
    # The read path of DLIO's DYAD PyTorch loader, spelled as it spells it:
    # explicit init with upstream's keywords, get_metadata(raw=True), locality
    # from owner_rank, dyad_open with the record, free_metadata.
    names = [f"{unique}/img_{i}.npz" for i in range(3)]
    nodes.run(0, f"""
        import os, pydyad
        for n in {names!r}:
            p = os.path.join(os.environ["DYAD_PATH_PRODUCER"], n)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with pydyad.dyad_open(p, "wb") as f:
                f.write(n.encode() * 100)
    """)
    out = nodes.run(1, f"""
        import os
        from pydyad import Dyad, dyad_open
        from pydyad.bindings import DTLMode, DTLCommMode
        managed = os.environ["DYAD_PATH_CONSUMER"]
        dyad_io = Dyad()
        dyad_io.init(debug=False, check=False, shared_storage=False, reinit=False,
                     async_publish=True, fsync_write=False, key_depth=3,
                     service_mux=1, key_bins=1024,
                     kvs_namespace=os.getenv("DYAD_KVS_NAMESPACE"),
                     prod_managed_path=managed, cons_managed_path=managed,
                     dtl_mode=DTLMode.DYAD_DTL_FLUX_RPC,
                     dtl_comm_mode=DTLCommMode.DYAD_COMM_RECV)
        ppn, node = 1, 1
        for n in {names!r}:
            filename = os.path.join(managed, n)
            file_obj = dyad_io.get_metadata(fname=filename, should_wait=True, raw=True)
            access = "local" if int(file_obj.contents.owner_rank * 1.0 / ppn) == node else "remote"
            with dyad_open(filename, "rb", dyad_ctx=dyad_io, metadata_wrapper=file_obj) as f:
                data = f.read()
            dyad_io.free_metadata(file_obj)
            print(access, data == n.encode() * 100)
    """, DYAD_CONSUME_TIMEOUT=20).stdout.split()
    assert out == ["remote", "True"] * 3


def test_check_sets_dyad_sync_health(cluster, node1, unique):
    libc = ctypes.CDLL(None)
    libc.getenv.restype = ctypes.c_char_p
    libc.unsetenv(pydyad.DYAD_CHECK_ENV.encode())
    node1.init(reinit=True, check=True, kvs_namespace=cluster.namespace,
               prod_managed_path=cluster.prod_dir(1), cons_managed_path=cluster.cons_dir(1))
    p = os.path.join(cluster.prod_dir(1), f"{unique}.chk")
    with open(p, "w") as f:
        f.write("x")
    assert libc.getenv(pydyad.DYAD_CHECK_ENV.encode()) is None
    node1.produce(p)
    assert libc.getenv(pydyad.DYAD_CHECK_ENV.encode()) == b"ok"
    libc.unsetenv(pydyad.DYAD_CHECK_ENV.encode())
