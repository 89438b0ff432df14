"""DyadDataset through a torch DataLoader with 2 workers on two nodes."""

import os
import uuid

import pytest

np = pytest.importorskip("numpy")
pytest.importorskip("torch")

N = 12


@pytest.fixture
def pfs(tmp_path):
    # A unique directory name: it is also the sample names' prefix in the
    # session-wide cluster, so tests must not share it.
    d = tmp_path / f"pfs-{uuid.uuid4().hex[:8]}"
    d.mkdir()
    for i in range(N):
        np.save(d / f"s{i}.npy", np.full(8, i, dtype=np.float32))
    return d


LOADER = """
    import collections, os, sys, numpy as np, torch
    from pydyad.data import DyadDataset
    files = [f"{{sub}}/s{{i}}.npy" for i in range({n})]
    ds = DyadDataset(files, {pfs!r} + "/..", return_source=True,
                     reader=lambda p: torch.from_numpy(np.load(p)))
    loader = torch.utils.data.DataLoader(ds, batch_size=3, num_workers=2)
    for epoch in range({epochs}):
        seen, src = [], collections.Counter()
        for x, s in loader:
            seen += [int(v) for v in x[:, 0]]
            src.update(s)
            assert bool((x == x[:, :1]).all())
        assert sorted(seen) == list(range({n})), seen
        print(epoch, src.get("pfs", 0), src.get("dyad", 0), src.get("local", 0))
"""


def test_dataloader_two_workers_two_nodes(cluster, nodes, pfs):
    sub = os.path.basename(pfs)
    # The dataset names files relative to pfs/..: "pfs/s3.npy".
    code = LOADER.format(n=N, pfs=str(pfs), epochs=2).replace("{sub}", sub)
    out0 = nodes.run(0, code, timeout=120).stdout.splitlines()
    # Node 0: first epoch reads everything from the PFS and caches it;
    # the second finds every sample in its own managed directory.
    assert out0 == [f"0 {N} 0 0", f"1 0 0 {N}"]
    for i in range(N):
        assert os.path.isfile(os.path.join(cluster.prod_dir(0), sub, f"s{i}.npy"))
    out1 = nodes.run(1, code, timeout=120, DYAD_CONSUME_TIMEOUT=30).stdout.splitlines()
    # Node 1: everything arrives through DYAD; epoch 2 reads the local copies.
    assert out1 == [f"0 0 {N} 0", f"1 0 0 {N}"]
    for i in range(N):
        got = np.load(os.path.join(cluster.cons_dir(1), sub, f"s{i}.npy"))
        assert (got == i).all()
        assert not os.path.exists(os.path.join(cluster.prod_dir(1), sub, f"s{i}.npy"))


def test_dataset_rejects_escaping_names(tmp_path):
    from pydyad.data import DyadDataset
    with pytest.raises(ValueError):
        DyadDataset(["../x.npy"], tmp_path, prod_dir=str(tmp_path), cons_dir=str(tmp_path))


def test_dataloader_spawned_workers(cluster, nodes, pfs):
    # spawn: each worker unpickles the dataset without a context and
    # initializes its own from the DYAD_* environment on first use.
    sub = os.path.basename(pfs)
    out = nodes.run(1, f"""
        import collections, torch
        from pydyad.data import DyadDataset
        if __name__ == "__main__":
            ds = DyadDataset([f"{sub}/s{{i}}.npy" for i in range({N})], {str(pfs)!r} + "/..",
                             return_source=True)
            loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2,
                                                 multiprocessing_context="spawn")
            src = collections.Counter()
            total = 0.0
            for x, s in loader:
                src.update(s)
                total += float(x.sum())
            print(sorted(src.items()), total)
    """, timeout=180, DYAD_CONSUME_TIMEOUT=30).stdout.strip()
    # Nobody published this dataset: node 1 reads the PFS and caches it.
    assert out == f"[('pfs', {N})] {float(8 * sum(range(N)))}"
    assert len(os.listdir(os.path.join(cluster.prod_dir(1), sub))) == N
