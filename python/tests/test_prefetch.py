"""Prefetch declarations, batch and background consumes, and DyadDataset's
look-ahead, against the two-node loopback cluster."""

import os
import time
import uuid

import pytest

from pydyad import DyadError


def _produce(nodes, names):
    nodes.run(0, f"""
        import os, pydyad
        d = pydyad.Dyad(); d.init_env()
        for name in {names!r}:
            p = os.path.join(os.environ["DYAD_PATH_PRODUCER"], name)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "wb") as f:
                f.write(name.encode())
            d.produce(p)
    """)


def _eventually(pred, seconds=10):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.02)
    return pred()


def _holds(path, data):
    try:
        with open(path, "rb") as f:
            return f.read() == data
    except FileNotFoundError:
        return False


def test_prefetch_before_and_after_publication(cluster, nodes, node1, unique):
    cons = cluster.cons_dir(1)
    _produce(nodes, [f"{unique}/early"])
    node1.prefetch(os.path.join(cons, unique) + "/")
    _produce(nodes, [f"{unique}/late", f"{unique}-other/x"])
    assert _eventually(lambda: _holds(os.path.join(cons, unique, "early"), f"{unique}/early".encode())
                       and _holds(os.path.join(cons, unique, "late"), f"{unique}/late".encode()))
    assert not os.path.exists(os.path.join(cons, f"{unique}-other", "x"))
    node1.prefetch(unique + "/", cancel=True)
    with pytest.raises(DyadError) as e:
        node1.prefetch(unique + "/", cancel=True)
    assert e.value.name == "DYAD_RC_NOTFOUND"
    with pytest.raises(DyadError) as e:
        node1.prefetch("/not/under/the/consumer/dir")
    assert e.value.name == "DYAD_RC_UNTRACKED"


def test_batch_and_background_consume(cluster, nodes, node1, unique):
    cons = cluster.cons_dir(1)
    names = [os.path.join(cons, unique, f"b{i}") for i in range(5)]
    pending = node1.consume_start(names, timeout=30)  # before anything is published
    _produce(nodes, [f"{unique}/b{i}" for i in range(5)])
    assert pending.wait() == [0] * 5
    for i, n in enumerate(names):
        assert _holds(n, f"{unique}/b{i}".encode())
    missing = os.path.join(cons, unique, "never")
    assert node1.consume_batch([names[0], missing], timeout=0.2, raise_errors=False) == \
        [0, -4000]
    with pytest.raises(DyadError) as e:
        node1.consume_batch([missing, names[1]], timeout=0.2)
    assert e.value.rc == -4000
    assert "never" in str(e.value)


def test_dataset_fetches_ahead(cluster, nodes, tmp_path):
    pytest.importorskip("numpy")
    sub = f"la-{uuid.uuid4().hex[:8]}"
    pfs = tmp_path / sub
    pfs.mkdir()
    n = 10
    for i in range(n):
        (pfs / f"s{i}").write_bytes(bytes([i]) * 100)
    files = [f"{sub}/s{i}" for i in range(n)]
    # Node 0 reads every sample once: cached from the PFS and published.
    nodes.run(0, f"""
        from pydyad.data import DyadDataset
        ds = DyadDataset({files!r}, {str(tmp_path)!r})
        assert [ds[i] for i in range({n})] == [bytes([i]) * 100 for i in range({n})]
    """)
    # Node 1: the look-ahead sampler yields the base order, and fetch_ahead
    # brings published samples here before any worker asks.
    out = nodes.run(1, f"""
        import os
        from pydyad.data import DyadDataset
        ds = DyadDataset({files!r}, {str(tmp_path)!r}, lookahead=4, return_source=True)
        order = [3, 1, 4, 0, 5, 9, 2, 6, 8, 7]
        assert ds.fetch_ahead(order[:4]) == 4
        assert ds.fetch_ahead(order[:4]) == 0  # already here: no request
        assert list(ds.lookahead_sampler(order)) == order
        pend = ds.fetch_ahead_start(order)  # whatever the sampler's thread had not reached yet
        rcs = pend.wait(raise_errors=False) if pend is not None else []
        missing = [i for i in order if not os.path.isfile(os.path.join(ds.cons_dir, {sub!r}, f"s{{i}}"))]
        assert not missing, (missing, rcs)
        got = [ds[i] for i in order]
        assert [s for s, _ in got] == [bytes([i]) * 100 for i in order]
        print(sorted(set(src for _, src in got)))
    """).stdout.strip()
    assert out == "['local']"
