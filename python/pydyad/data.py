"""DyadDataset: a locality-aware torch Dataset over DYAD (seed case 4).

Training data lives in a shared "parallel file system" directory (``pfs_dir``)
that every node can read but that is slow for many small files. For each
sample the dataset asks DYAD's hierarchical locator, cheapest level first:

1. **local** - the file is already in this node's producer directory (this
   node, perhaps another DataLoader worker, cached it earlier) or complete
   in its consumer directory (fetched earlier): read it, no network.
2. **dyad** - its record is published (``get_metadata(should_wait=False)``):
   ``consume_w_metadata`` makes it complete in the consumer directory,
   fetching it from the owner node if needed (or returning at once when the
   copy there is current), and the sample is read from there.
3. **pfs** - nobody has it: read it from ``pfs_dir``, write it into the
   producer directory (temporary name, then an atomic rename, so no reader
   sees a partial copy) and publish it as owned by this node
   (cache-on-first-read), so other nodes get it through DYAD from now on.

Two workers missing the same file at the same moment may both copy and
publish it; both copies are complete and the later record wins, so this
costs one extra PFS read and never correctness.

torch is optional: without it ``DyadDataset`` is a plain map-style dataset
(``__getitem__``/``__len__``), which is all ``torch.utils.data.DataLoader``
needs anyway.

Worker processes: with the default ``fork`` start method the workers share
the parent's DYAD context; with ``spawn`` each worker initializes its own
from the DYAD_* environment on first use.

Look-ahead: ``DyadDataset(..., lookahead=K)`` and a DataLoader built with
``sampler=ds.lookahead_sampler(base_sampler)`` fetch the next K samples of
the sampler's order (those published by another node and not yet here) in
batch consumes while the current batch trains, so workers find them
already local. K defaults to $DYAD_LOOKAHEAD, else 0 (off); the batches
in flight at once, to $DYAD_LOOKAHEAD_BATCHES, else 2.
"""

import atexit
import collections
import os
import tempfile
import threading
import weakref

from . import _pydyad
from .context import default_dyad

try:  # Only for the base class; pydyad itself does not need torch.
    from torch.utils.data import Dataset as _Base
except ImportError:  # pragma: no cover - exercised only without torch
    _Base = object

SOURCE_LOCAL = "local"
SOURCE_DYAD = "dyad"
SOURCE_PFS = "pfs"


def read_sample(path):
    """Default reader: numpy arrays for .npy/.npz, bytes otherwise."""
    if path.endswith((".npy", ".npz")):
        import numpy as np
        return np.load(path, allow_pickle=False)
    with open(path, "rb") as f:
        return f.read()


class DyadDataset(_Base):
    """Map-style dataset of files named relative to ``pfs_dir``.

    Args:
      files: relative paths of the samples (e.g. ``["s0.npy", "s1.npy"]``).
      pfs_dir: the shared directory holding the originals.
      prod_dir / cons_dir: this node's DYAD producer and consumer
        directories (default: DYAD_PATH_PRODUCER / DYAD_PATH_CONSUMER).
      reader: ``reader(path) -> sample`` (default :func:`read_sample`).
      transform: applied to the reader's result.
      dyad_ctx: a :class:`pydyad.Dyad` (default: the process's default).
      return_source: if true, items are ``(sample, source)`` with source one
        of "local", "dyad", "pfs", for statistics.
      lookahead: samples to fetch ahead of the sampler's position (see
        :meth:`lookahead_sampler`; default $DYAD_LOOKAHEAD, else 0).
      lookahead_batches: batch consumes of the look-ahead in flight at once,
        each of up to min(ceil(lookahead / lookahead_batches), 64) samples
        (default $DYAD_LOOKAHEAD_BATCHES, else 2).
    """

    def __init__(self, files, pfs_dir, prod_dir=None, cons_dir=None, reader=None,
                 transform=None, dyad_ctx=None, return_source=False, lookahead=None,
                 lookahead_batches=None):
        self.files = [os.fspath(f) for f in files]
        for f in self.files:
            if os.path.isabs(f) or ".." in f.split(os.sep):
                raise ValueError(f"sample names must be relative and stay inside pfs_dir: {f!r}")
        self.pfs_dir = os.fspath(pfs_dir)
        self.prod_dir = prod_dir or os.environ.get("DYAD_PATH_PRODUCER")
        self.cons_dir = cons_dir or os.environ.get("DYAD_PATH_CONSUMER")
        if not self.prod_dir or not self.cons_dir:
            raise ValueError("DyadDataset needs producer and consumer directories "
                             "(arguments or DYAD_PATH_PRODUCER / DYAD_PATH_CONSUMER)")
        self.reader = reader or read_sample
        self.transform = transform
        self.return_source = return_source
        self._ctx = dyad_ctx
        if lookahead is None:
            lookahead = int(os.environ.get("DYAD_LOOKAHEAD", "0") or 0)
        if lookahead < 0:
            raise ValueError(f"lookahead must be >= 0, not {lookahead}")
        self.lookahead = lookahead
        if lookahead_batches is None:
            lookahead_batches = int(os.environ.get("DYAD_LOOKAHEAD_BATCHES", "2") or 2)
        if lookahead_batches < 1:
            raise ValueError(f"lookahead_batches must be >= 1, not {lookahead_batches}")
        self.lookahead_batches = lookahead_batches

    def __len__(self):
        return len(self.files)

    def __getstate__(self):
        # A Dyad is only a handle on the per-process context; a spawned
        # worker builds its own on first use.
        state = self.__dict__.copy()
        state["_ctx"] = None
        return state

    def _dyad(self):
        if self._ctx is None or not _pydyad.is_initialized():
            self._ctx = default_dyad()
            if not _pydyad.is_initialized():
                self._ctx.init_env()
        return self._ctx

    def locate(self, rel):
        """Make sample ``rel`` readable on this node; returns (path, source)."""
        prod = os.path.join(self.prod_dir, rel)
        if os.path.isfile(prod):
            return prod, SOURCE_LOCAL
        dyad = self._dyad()
        cons = os.path.join(self.cons_dir, rel)
        if os.path.isfile(cons):
            # A complete earlier copy (DYAD renames only complete files into
            # the consumer directory). consume() confirms it without any
            # request when that directory is private to this node.
            dyad.consume(cons)
            return cons, SOURCE_LOCAL
        md = dyad.get_metadata(cons, should_wait=False, raw=True)
        if md is not None:
            try:
                dyad.consume_w_metadata(cons, md)
            finally:
                md.free()
            if os.path.isfile(cons):
                return cons, SOURCE_DYAD
            # Published by this node's own service: consume leaves it in the
            # producer directory (nothing to transfer).
            if os.path.isfile(prod):
                return prod, SOURCE_LOCAL
            raise FileNotFoundError(f"{rel}: consumed but found neither {cons} nor {prod}")
        self._cache_from_pfs(rel, prod)
        dyad.produce(prod)
        return prod, SOURCE_PFS

    def _cache_from_pfs(self, rel, prod):
        src = os.path.join(self.pfs_dir, rel)
        os.makedirs(os.path.dirname(prod), exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".pydyad-", dir=os.path.dirname(prod))
        try:
            with open(src, "rb") as fin, os.fdopen(fd, "wb") as fout:
                while True:
                    chunk = fin.read(1 << 20)
                    if not chunk:
                        break
                    fout.write(chunk)
            # mkstemp makes the file 0600; give it a data file's usual mode.
            os.chmod(tmp, 0o644)
            os.replace(tmp, prod)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise

    def __getitem__(self, index):
        path, source = self.locate(self.files[index])
        sample = self.reader(path)
        if self.transform is not None:
            sample = self.transform(sample)
        return (sample, source) if self.return_source else sample

    def lookahead_sampler(self, base):
        """Wrap the sampler ``base`` (e.g. ``RandomSampler(ds)``) so that the
        next :attr:`lookahead` samples of its order are fetched ahead."""
        return LookaheadSampler(self, base, self.lookahead, self.lookahead_batches)

    def fetch_ahead(self, indices):
        """Bring samples ``indices`` to this node in one batch consume when
        they are published elsewhere and not local yet; samples nobody
        published are left to :meth:`locate` (the PFS path). Returns how
        many were consumed."""
        pending = self.fetch_ahead_start(indices)
        if pending is None:
            return 0
        return sum(1 for rc in pending.wait(raise_errors=False) if rc == 0)

    def fetch_ahead_start(self, indices):
        """:meth:`fetch_ahead` in the background: returns the running
        :class:`pydyad.AsyncConsume` (``wait()`` for it), or None when every
        sample is already local."""
        names = []
        for i in indices:
            rel = self.files[i]
            if os.path.isfile(os.path.join(self.prod_dir, rel)):
                continue
            cons = os.path.join(self.cons_dir, rel)
            if not os.path.isfile(cons):
                names.append(cons)
        if not names:
            return None
        return self._dyad().consume_start(names, timeout=0)


class LookaheadSampler:
    """A sampler yielding ``base``'s order while a background thread keeps
    the next ``k`` samples fetched (DyadDataset.fetch_ahead_start), in up to
    ``batches`` batch consumes in flight at once.

    The thread runs in the process iterating the sampler (the DataLoader's
    main process); the copies it places are complete files in the consumer
    directory, which the workers then read locally.
    """

    def __init__(self, dataset, base, k, batches=2):
        self.dataset = dataset
        self.base = base
        self.k = k
        self.batches = max(1, batches)

    def __len__(self):
        return len(self.base)

    def __iter__(self):
        order = list(iter(self.base))
        if self.k <= 0:
            yield from order
            return
        ahead = _Ahead(self.dataset, order, self.k, self.batches)
        finished = False
        try:
            for n, index in enumerate(order):
                ahead.reached(n)
                yield index
            finished = True
        finally:
            # A DataLoader takes its last indices well before its workers
            # read those samples: at the end of the order the look-ahead
            # still fetches the rest, on its own. Left early (break, an
            # error), it stops and waits for its batches in flight.
            if finished:
                ahead.drain()
            else:
                ahead.close()


# Look-aheads still running. A drained one goes on fetching after its
# sampler ended; at interpreter exit its daemon thread would be frozen while
# a batch consume it waits for is still running in C++, and taking the GIL
# back after that batch ends kills the thread from under pybind11
# ("terminate called without an active exception"). So every look-ahead is
# closed (no new batch; those in flight are waited for) before Python
# finalizes.
_running = weakref.WeakSet()


@atexit.register
def _close_running_lookaheads():
    for ahead in list(_running):
        ahead.close()


class _Ahead:
    """The look-ahead of one pass over a sampler's ``order``: a thread that
    keeps up to ``batches`` batch consumes of ``chunk`` samples in flight,
    none starting more than ``k`` samples past the sampler's position.

    With one batch at a time, workers that read local samples quickly
    overtook the look-ahead while it waited for its batch; a second batch
    in flight hides one batch's round trip behind the other's transfers.
    """

    def __init__(self, dataset, order, k, batches):
        self._dataset = dataset
        self._order = order
        self._k = k
        self._batches = batches
        self._chunk = max(1, min(-(-k // batches), 64))
        self._pos = 0
        self._stop = False
        self._cv = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="pydyad-lookahead", daemon=True)
        _running.add(self)
        self._thread.start()

    def reached(self, n):
        with self._cv:
            self._pos = n
            self._cv.notify()

    def drain(self):
        """Lets the thread fetch the rest of the order; it ends by itself
        once its last batch is done."""
        with self._cv:
            self._pos = len(self._order)
            self._cv.notify()

    def close(self):
        """Stops starting batches and joins the thread, which first waits
        for the batches still in flight (bounded: they take only samples
        already published)."""
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join()

    def _may_start(self, start):
        return start < len(self._order) and start < self._pos + self._k

    def _run(self):
        in_flight = collections.deque()
        start = 0
        try:
            while start < len(self._order) or in_flight:
                with self._cv:
                    if not in_flight:
                        self._cv.wait_for(lambda: self._stop or self._may_start(start))
                    if self._stop:
                        return
                    go = len(in_flight) < self._batches and self._may_start(start)
                if go:
                    pending = self._start(self._order[start:start + self._chunk])
                    if pending is not None:
                        in_flight.append(pending)
                    start += self._chunk
                else:
                    self._finish(in_flight.popleft())
        finally:
            while in_flight:
                self._finish(in_flight.popleft())

    def _start(self, indices):
        try:
            return self._dataset.fetch_ahead_start(indices)
        except Exception:  # look-ahead only speeds reads up; locate() still works
            return None

    @staticmethod
    def _finish(pending):
        try:
            pending.wait(raise_errors=False)
        except Exception:
            pass
