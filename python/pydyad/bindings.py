"""The Dyad class: Python access to the process's DYAD context.

Upstream pydyad wraps the C library with ctypes; this module keeps its
names and signatures (``Dyad``, ``DTLMode``, ``DTLCommMode``, ``init``,
``init_env``, ``produce``, ``get_metadata``, ``consume``,
``consume_w_metadata``, ``free_metadata``, ``finalize``) so upstream scripts
run unchanged, on top of the pybind11 extension ``pydyad._pydyad``.

The C context is one per process. A ``Dyad`` object is a handle on it:
several ``Dyad`` objects in one process share the same settings, and
``finalize()`` on any of them finalizes the process's context. The context
survives ``fork()`` (a forked DataLoader worker opens its own connection to
the node's service), so a Dyad created before the fork keeps working in the
child.

Every failure raises :class:`DyadError` (a ``RuntimeError``) with ``.rc``
(the ``dyad_rc_t`` value), ``.name`` (e.g. ``"DYAD_RC_TIMEOUT"``) and the
library's message. Blocking calls release the GIL and can be interrupted with
Ctrl-C (``KeyboardInterrupt``).
"""

import enum
import os
import pathlib

from . import _pydyad

DyadError = _pydyad.DyadError
RawMetadata = _pydyad.Metadata

# The variable set to "ok" after each successful produce/consume when the
# context was initialized with check=True (DYAD_SYNC_CHECK), as upstream.
DYAD_CHECK_ENV = "DYAD_SYNC_HEALTH"

# dyad_rc_t values used by callers to tell outcomes apart.
DYAD_RC_OK = 0
DYAD_RC_NOTFOUND = -2002
DYAD_RC_TIMEOUT = -4000
DYAD_RC_NOSERVICE = -4001
DYAD_RC_CANCELLED = -4007


class DTLMode(enum.Enum):
    """Data transport for fetches; the value is the name the C API takes.

    ``DYAD_DTL_FLUX_RPC`` (the default) selects TCP streaming, as there is no
    Flux here; ``UCX`` and ``OFI`` work when compiled into the service.
    ``DYAD_DTL_MARGO`` (upstream's Mercury bulk pull; Margo is not packaged)
    is an alias of ``DYAD_DTL_OFI``, the libfabric RMA-read pull transport
    that plays Margo's role here.
    """

    DYAD_DTL_UCX = "UCX"
    DYAD_DTL_FLUX_RPC = "FLUX_RPC"
    DYAD_DTL_TCP = "TCP"
    DYAD_DTL_OFI = "OFI"
    DYAD_DTL_MARGO = "OFI"
    DYAD_DTL_LOCAL = "LOCAL"

    def __str__(self):
        return self.value


class DTLCommMode(enum.IntEnum):
    """Role of the process in transfers (dyad_dtl_comm_mode_t)."""

    DYAD_COMM_NONE = 0
    DYAD_COMM_RECV = 1
    DYAD_COMM_SEND = 2
    DYAD_COMM_END = 3


class DyadMetadata:
    """A published file's record, as plain Python values.

    ``fpath`` is relative to the managed directory, ``owner_rank`` the rank of
    the service that owns the file, ``size`` its size in bytes when published,
    ``version`` its modification stamp in nanoseconds.
    """

    __slots__ = ("fpath", "owner_rank", "size", "version")

    def __init__(self, fpath, owner_rank, size=0, version=0):
        self.fpath = fpath
        self.owner_rank = owner_rank
        self.size = size
        self.version = version

    @classmethod
    def from_raw(cls, raw):
        return cls(raw.fpath, raw.owner_rank, raw.size, raw.version)

    def to_raw(self):
        return RawMetadata(self.fpath, self.owner_rank, self.size, self.version)

    def __eq__(self, other):
        if not isinstance(other, DyadMetadata):
            return NotImplemented
        return (self.fpath, self.owner_rank, self.size, self.version) == (
            other.fpath, other.owner_rank, other.size, other.version)

    def __repr__(self):
        return (f"DyadMetadata(fpath={self.fpath!r}, owner_rank={self.owner_rank}, "
                f"size={self.size}, version={self.version})")


def _dtl_mode_name(dtl_mode):
    if dtl_mode is None:
        return None
    if isinstance(dtl_mode, DTLMode):
        return dtl_mode.value
    if isinstance(dtl_mode, bytes):
        return dtl_mode.decode()
    if isinstance(dtl_mode, str):
        # Accept both "TCP" and upstream-style "DYAD_DTL_TCP".
        name = dtl_mode[len("DYAD_DTL_"):] if dtl_mode.startswith("DYAD_DTL_") else dtl_mode
        return DTLMode.DYAD_DTL_MARGO.value if name.upper() == "MARGO" else name
    raise TypeError(f"dtl_mode must be a DTLMode or str, not {type(dtl_mode).__name__}")


def _flux_handle_address(flux_handle):
    """The address of the caller's open ``flux_t`` (0 for None), as
    dyad_init's flux_handle: a ``flux.Flux`` object of Flux's Python
    bindings, or its ``handle`` (a cffi ``flux_t *``). Plain integers are
    refused: a wrong address would crash the process."""
    if flux_handle is None:
        return 0
    handle = getattr(flux_handle, "handle", flux_handle)
    address = 0
    if type(handle).__name__ == "CData" or type(handle).__module__ == "_cffi_backend":
        try:
            import cffi  # the Flux bindings' handles are cffi pointers

            ffi = cffi.FFI()
            if ffi.typeof(handle).kind == "pointer":
                address = int(ffi.cast("uintptr_t", handle))
        except Exception:  # noqa: BLE001 (any failure means "not a handle")
            address = 0
    if address == 0:
        raise TypeError("flux_handle must be an open flux.Flux handle or None, not "
                        f"{type(flux_handle).__name__}")
    if address <= 0:
        raise TypeError("flux_handle must point to an open flux_t (got a null address)")
    return address


class Dyad:
    """Handle on this process's DYAD context (shared by all Dyad objects)."""

    def __init__(self):
        self.initialized = _pydyad.is_initialized()

    # -- the managed directories (upstream's attributes) --------------------
    @property
    def prod_path(self):
        """The producer-managed directory (absolute ``pathlib.Path``), or
        None when none is set or the context is not initialized."""
        prod, _ = _pydyad.managed_paths()
        return None if prod is None else pathlib.Path(prod)

    @property
    def cons_path(self):
        """The consumer-managed directory (absolute ``pathlib.Path``), or
        None when none is set or the context is not initialized."""
        _, cons = _pydyad.managed_paths()
        return None if cons is None else pathlib.Path(cons)

    # -- initialization -------------------------------------------------
    def init(self, debug=False, check=False, shared_storage=False, reinit=False,
             async_publish=False, fsync_write=False, key_depth=3, key_bins=1024,
             service_mux=1, kvs_namespace=None, prod_managed_path=None,
             cons_managed_path=None, relative_to_managed_path=False, dtl_mode=None,
             dtl_comm_mode=DTLCommMode.DYAD_COMM_RECV, flux_handle=None):
        """dyad_init(): explicit settings. The service socket and timeouts
        still come from DYAD_SERVICE_SOCKET, DYAD_CONSUME_TIMEOUT, ...
        ``flux_handle``: the caller's open Flux handle (``flux.Flux()``),
        used for consumes when this node's broker runs no dyad module
        (docs/flux.md); it must stay open while DYAD is initialized."""
        handle = _flux_handle_address(flux_handle)
        _pydyad.init(bool(debug), bool(check), bool(shared_storage), bool(reinit),
                     bool(async_publish), bool(fsync_write), int(key_depth), int(key_bins),
                     int(service_mux), _opt_str(kvs_namespace), _opt_path(prod_managed_path),
                     _opt_path(cons_managed_path), bool(relative_to_managed_path),
                     _dtl_mode_name(dtl_mode), int(dtl_comm_mode), handle)
        self._flux_handle = flux_handle  # kept open while DYAD may use it
        self.initialized = True

    def init_env(self, dtl_comm_mode=DTLCommMode.DYAD_COMM_RECV, flux_handle=None):
        """dyad_init_env(): every setting from the DYAD_* environment
        (``flux_handle`` as for init)."""
        handle = _flux_handle_address(flux_handle)
        _pydyad.init_env(int(dtl_comm_mode), handle)
        self._flux_handle = flux_handle
        self.initialized = True

    def finalize(self):
        """dyad_finalize(): releases the process's context (all Dyad objects)."""
        _pydyad.finalize()
        self.initialized = False

    def __del__(self):
        # The context belongs to the process, not to this object: other
        # Dyad objects and forked children may still use it. Nothing to do.
        pass

    # -- producer / consumer ---------------------------------------------
    def produce(self, fname):
        """Publish a complete, closed file under the producer directory."""
        _pydyad.produce(fname)

    def consume(self, fname):
        """Return once ``fname`` is complete under the consumer directory."""
        _pydyad.consume(fname)

    def prefetch(self, pattern, cancel=False):
        """Declare that this process will read the files matching ``pattern``.

        ``pattern`` is a path prefix, or a glob with ``*``, ``?`` or ``[]``
        (``*`` also matches ``/``), absolute under the consumer directory or
        relative to it. The node's service fetches each matching file into
        the consumer directory as soon as it is published (already published
        ones at once), so a later :meth:`consume` is a local hit.
        ``cancel=True`` withdraws the declaration.
        """
        _pydyad.prefetch(pattern, cancel)

    def consume_batch(self, fnames, timeout=None, raise_errors=True):
        """Consume many files in one request, fetched concurrently.

        Returns one ``dyad_rc_t`` per name, in order (0: complete locally).
        With ``raise_errors`` (default), the first failure raises
        :class:`DyadError` after the whole batch ran. ``timeout`` (seconds)
        replaces DYAD_CONSUME_TIMEOUT for this batch; 0 takes only files
        already published.
        """
        return self.consume_start(fnames, timeout).wait(raise_errors)

    def consume_start(self, fnames, timeout=None):
        """Start :meth:`consume_batch` in the background; returns an
        :class:`AsyncConsume` whose ``wait()`` gives its result."""
        return AsyncConsume(list(fnames), _pydyad.consume_start(list(fnames), timeout))

    def get_metadata(self, fname, should_wait=False, raw=False):
        """Look up a file's published record.

        Returns None when the file is not published (and ``should_wait`` is
        false) or lies outside the consumer directory; with ``should_wait``
        it waits like a consume (bounded by DYAD_CONSUME_TIMEOUT). With
        ``raw=True`` the result is the C record (``RawMetadata``) to pass to
        :meth:`consume_w_metadata`, otherwise a :class:`DyadMetadata`. Like
        upstream's ctypes pointer, a ``RawMetadata`` has ``.contents`` with
        ``fpath`` (bytes) and ``owner_rank``.
        """
        md = _pydyad.get_metadata(fname, bool(should_wait))
        if md is None or raw:
            return md
        try:
            return DyadMetadata.from_raw(md)
        finally:
            md.free()

    def free_metadata(self, metadata_wrapper):
        """Free a raw record now (it is also freed when garbage collected)."""
        if isinstance(metadata_wrapper, RawMetadata):
            metadata_wrapper.free()

    def consume_w_metadata(self, fname, metadata_wrapper):
        """Consume with a record from get_metadata (raw or not); None means
        the file is already local, as upstream."""
        if isinstance(metadata_wrapper, DyadMetadata):
            raw = metadata_wrapper.to_raw()
            try:
                _pydyad.consume_w_metadata(fname, raw)
            finally:
                raw.free()
        else:
            _pydyad.consume_w_metadata(fname, metadata_wrapper)

    def __repr__(self):
        return f"<pydyad.Dyad initialized={_pydyad.is_initialized()}>"


class AsyncConsume:
    """A batch consume running in the background (:meth:`Dyad.consume_start`)."""

    def __init__(self, names, handle):
        self.names = names
        self._handle = handle
        self._results = None

    def wait(self, raise_errors=True):
        """Block until every file is done (the GIL is released meanwhile);
        returns one ``dyad_rc_t`` per name. With ``raise_errors``, the first
        failure raises :class:`DyadError` naming its file."""
        if self._results is None:
            self._results = self._handle.results()
        if raise_errors:
            for name, (rc, message) in zip(self.names, self._results):
                if rc != DYAD_RC_OK:
                    err = DyadError(f"{_pydyad.rc_name(rc)}: {message or name}")
                    err.rc = rc
                    err.name = _pydyad.rc_name(rc)
                    raise err
        return [rc for rc, _ in self._results]

    def __len__(self):
        return len(self.names)


def _opt_str(value):
    return None if value is None else str(value)


def _opt_path(value):
    return None if value is None else os.fsdecode(value)
