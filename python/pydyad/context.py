"""dyad_open: open() that consumes before reading and produces after writing.

``with dyad_open(path, "rb") as f`` first waits until ``path`` is published
and complete in the consumer directory (fetching it if needed), then opens
it; ``with dyad_open(path, "wb") as f`` publishes the file once it is closed.
Paths outside the managed directories open exactly as with ``open()`` (the
C calls do nothing for them).

Without ``dyad_ctx`` the process-wide default ``Dyad`` is used, initialized
from the environment on first use (``DYAD_PATH_PRODUCER``,
``DYAD_PATH_CONSUMER``, ``DYAD_SERVICE_SOCKET``, ...);
``register_dyad_ctx=True`` makes the given ``dyad_ctx`` that default.
"""

import builtins
import contextlib
import os
import threading

from . import _pydyad
from .bindings import Dyad, DTLCommMode

_default_lock = threading.Lock()
_default_ctx = None


def default_dyad():
    """The process's default Dyad, initialized from the environment once."""
    global _default_ctx
    with _default_lock:
        if _default_ctx is None:
            ctx = Dyad()
            if not ctx.initialized:
                ctx.init_env(DTLCommMode.DYAD_COMM_RECV)
            _default_ctx = ctx
        return _default_ctx


def register_default_dyad(ctx):
    global _default_ctx
    with _default_lock:
        _default_ctx = ctx


def mode_reads_existing(mode):
    """True when an open in ``mode`` reads a file that must already exist:
    'r', 'rb', 'rt', 'r+', 'r+b' (and h5py's 'r', 'r+')."""
    return mode.startswith("r")


def mode_writes(mode):
    """True when an open in ``mode`` may write: 'w', 'a', 'x', any '+'
    (and h5py's 'w', 'w-', 'x', 'a', 'r+')."""
    return any(c in mode for c in "wax+")


def _split_args(args, kwargs):
    if args:
        fname = args[0]
    elif "file" in kwargs:
        fname = kwargs["file"]
    else:
        raise TypeError("dyad_open() missing the file argument")
    if len(args) > 1:
        mode = args[1]
    else:
        mode = kwargs.get("mode", "r")
    return fname, mode


def _open_for_writing(fname, mode, kwargs):
    """open(fname, mode) under the producer's lock (the client library's, the
    same the preload library and the C++ streams take): a service never serves
    the file while it is rewritten. 'w' truncates only once the lock is held."""
    kwargs = {k: v for k, v in kwargs.items() if k not in ("file", "mode")}
    flags = os.O_CLOEXEC | os.O_CREAT
    flags |= os.O_RDWR if ("+" in mode or "r" in mode) else os.O_WRONLY
    if "a" in mode:
        flags |= os.O_APPEND
    if "x" in mode:
        flags |= os.O_EXCL
    if "r" in mode:
        flags &= ~os.O_CREAT
    fd = os.open(os.fspath(fname), flags, 0o666)
    try:
        _pydyad.producer_lock(fd)
        if "w" in mode:
            os.ftruncate(fd, 0)
        return os.fdopen(fd, mode.replace("x", "w"), **kwargs)
    except BaseException:
        os.close(fd)
        raise


@contextlib.contextmanager
def dyad_open(*args, dyad_ctx=None, metadata_wrapper=None, register_dyad_ctx=False, **kwargs):
    """Context manager around ``open(*args, **kwargs)`` with DYAD semantics.

    ``metadata_wrapper``, a record from ``Dyad.get_metadata``, makes the read
    path use ``consume_w_metadata`` (no second lookup). The file is published
    after a successful close in a writing mode; if the body raises, the file
    is closed but not published, since it may be incomplete.
    """
    if dyad_ctx is None:
        dyad_ctx = default_dyad()
    elif register_dyad_ctx:
        register_default_dyad(dyad_ctx)
    fname, mode = _split_args(args, kwargs)
    if isinstance(fname, int):
        raise TypeError("dyad_open() needs a path, not a file descriptor")
    if mode_reads_existing(mode):
        if metadata_wrapper is not None:
            dyad_ctx.consume_w_metadata(fname, metadata_wrapper)
        else:
            dyad_ctx.consume(fname)
    if mode_writes(mode) and not args[2:]:
        f = _open_for_writing(fname, mode, kwargs)
    else:
        f = builtins.open(*args, **kwargs)
    try:
        yield f
    except BaseException:
        f.close()
        raise
    f.close()
    if mode_writes(mode):
        dyad_ctx.produce(fname)
