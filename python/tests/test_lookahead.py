"""DyadDataset's look-ahead sampler: batches in flight, order, coverage and
clean-up, first against a recording dataset (what the sampler asks for and
when), then against the two-node loopback cluster."""

import threading
import time
import uuid

import pytest

from pydyad.data import DyadDataset, LookaheadSampler


class _Pending:
    """A batch consume in flight: done when the test releases it."""

    def __init__(self, owner, indices):
        self.owner = owner
        self.indices = indices
        self.done = threading.Event()

    def wait(self, raise_errors=True):
        assert self.done.wait(10), "a batch was never released"
        with self.owner.lock:
            self.owner.in_flight -= 1
        return [0] * len(self.indices)


class _Recorder:
    """Stands for a DyadDataset: records each fetch_ahead_start, the
    sampler position it happened at, and how many were in flight."""

    def __init__(self, release_after=0.0):
        self.lock = threading.Lock()
        self.batches = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.release_after = release_after

    def fetch_ahead_start(self, indices):
        p = _Pending(self, list(indices))
        with self.lock:
            self.batches.append(p)
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        threading.Timer(self.release_after, p.done.set).start()
        return p


def _lookahead_threads():
    return [t for t in threading.enumerate() if t.name == "pydyad-lookahead"]


def _threads_end(seconds=10):
    deadline = time.monotonic() + seconds
    while _lookahead_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    return not _lookahead_threads()


def test_two_batches_in_flight_cover_each_sample_once_in_order():
    order = [(i * 37) % 100 for i in range(100)]
    rec = _Recorder(release_after=0.02)
    sampler = LookaheadSampler(rec, order, k=16, batches=2)
    got = []
    for index in sampler:
        got.append(index)
        time.sleep(0.001)
    assert got == order
    # At the end of the order the thread fetches the rest on its own (the
    # DataLoader's workers read those samples later), then ends.
    assert _threads_end()
    fetched = [i for b in rec.batches for i in b.indices]
    assert fetched == order  # every sample asked for once, in the sampler's order
    assert [len(b.indices) for b in rec.batches] == [8] * 12 + [4]  # ceil(16 / 2)
    assert rec.most_in_flight == 2
    assert rec.in_flight == 0 and not _lookahead_threads()


def test_one_batch_at_a_time_when_asked():
    rec = _Recorder(release_after=0.01)
    assert list(LookaheadSampler(rec, list(range(40)), k=16, batches=1)) == list(range(40))
    assert _threads_end()
    assert rec.most_in_flight == 1
    assert [i for b in rec.batches for i in b.indices] == list(range(40))


def test_lookahead_stays_within_k_of_the_sampler():
    rec = _Recorder()
    it = iter(LookaheadSampler(rec, list(range(64)), k=8, batches=2))
    assert next(it) == 0
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and sum(len(b.indices) for b in rec.batches) < 8:
        time.sleep(0.01)
    time.sleep(0.1)  # had it gone further, it would have by now
    assert [i for b in rec.batches for i in b.indices] == list(range(8))
    it.close()
    assert rec.in_flight == 0 and not _lookahead_threads()


def test_early_exit_waits_for_batches_in_flight_and_stops():
    rec = _Recorder(release_after=0.2)
    sampler = LookaheadSampler(rec, list(range(1000)), k=128, batches=2)
    for n, _ in enumerate(sampler):
        if n == 5:
            break  # the generator is closed here (CPython), running its finally
    assert rec.in_flight == 0, "a batch was left running after the sampler closed"
    assert not _lookahead_threads()
    assert sum(len(b.indices) for b in rec.batches) < 1000


def test_dataset_argument_and_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("DYAD_LOOKAHEAD_BATCHES", "3")
    ds = DyadDataset([], tmp_path, prod_dir=str(tmp_path), cons_dir=str(tmp_path), lookahead=6)
    assert ds.lookahead_batches == 3
    assert ds.lookahead_sampler([]).batches == 3
    ds = DyadDataset([], tmp_path, prod_dir=str(tmp_path), cons_dir=str(tmp_path),
                     lookahead_batches=1)
    assert ds.lookahead_batches == 1
    with pytest.raises(ValueError):
        DyadDataset([], tmp_path, prod_dir=str(tmp_path), cons_dir=str(tmp_path),
                    lookahead_batches=0)


def test_two_batches_in_flight_against_real_services(cluster, nodes, tmp_path):
    sub = f"la2-{uuid.uuid4().hex[:8]}"
    pfs = tmp_path / sub
    pfs.mkdir()
    n = 48
    for i in range(n):
        (pfs / f"s{i}").write_bytes(bytes([i]) * 1000)
    files = [f"{sub}/s{i}" for i in range(n)]
    nodes.run(0, f"""
        from pydyad.data import DyadDataset
        ds = DyadDataset({files!r}, {str(tmp_path)!r})
        assert [ds[i] for i in range({n})] == [bytes([i]) * 1000 for i in range({n})]
    """)
    # Node 1 walks the sampler without reading, so the look-ahead runs
    # ahead of nothing: every sample must arrive through it alone.
    out = nodes.run(1, f"""
        import os, random, threading, time
        from pydyad.data import DyadDataset
        ds = DyadDataset({files!r}, {str(tmp_path)!r}, lookahead=8, lookahead_batches=2,
                         return_source=True)
        order = list(range({n}))
        random.Random(7).shuffle(order)
        assert list(ds.lookahead_sampler(order)) == order
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(
                t.name == "pydyad-lookahead" for t in threading.enumerate()):
            time.sleep(0.01)
        assert ds.fetch_ahead(order) == 0, "the look-ahead left samples behind"
        got = [ds[i] for i in order]
        assert [s for s, _ in got] == [bytes([i]) * 1000 for i in order]
        print(sorted(set(src for _, src in got)))
    """).stdout.strip()
    assert out == "['local']"
