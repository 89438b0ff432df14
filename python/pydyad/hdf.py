"""DyadFile: an h5py.File that consumes before reading and produces after writing.

``DyadFile(path, "r")`` waits until ``path`` is published and complete in the
consumer directory, then opens it; a file opened for writing ('w', 'w-', 'x',
'a', 'r+') is published when closed (``close()`` or leaving the ``with``
block). HDF5 writes its file through the HDF5 library, not Python, so
publishing strictly after the HDF5 close is what guarantees a consumer never
sees a half-written file.
"""

import os

import h5py

from .context import default_dyad, mode_reads_existing, mode_writes


class DyadFile(h5py.File):
    """h5py.File with DYAD synchronization (see the module doc).

    Extra keyword arguments: ``dyad_ctx`` (a Dyad; default: the process's
    default, initialized from the environment) and ``metadata_wrapper`` (a
    record from ``Dyad.get_metadata`` to consume without a second lookup).
    """

    def __init__(self, name, mode="r", *args, dyad_ctx=None, metadata_wrapper=None, **kwargs):
        mode = mode or "r"  # h5py 3 treats None as "r"
        if isinstance(name, (str, bytes, os.PathLike)):
            path = os.fsdecode(name)
        else:
            # An h5py FileID or a file-like object: nothing DYAD can track.
            path = None
        ctx = dyad_ctx if dyad_ctx is not None else (default_dyad() if path else None)
        if path is not None and mode_reads_existing(mode):
            if metadata_wrapper is not None:
                ctx.consume_w_metadata(path, metadata_wrapper)
            else:
                ctx.consume(path)
        super().__init__(name, mode, *args, **kwargs)
        # Set after the open so a failed open publishes nothing.
        self._dyad_ctx = ctx
        self._dyad_path = path if path is not None and mode_writes(mode) else None

    def close(self):
        pending = getattr(self, "_dyad_path", None)
        was_open = bool(self.id.valid) if hasattr(self, "id") else False
        super().close()
        if pending is not None and was_open:
            # Publish once, after HDF5 has flushed and closed the file.
            self._dyad_path = None
            self._dyad_ctx.produce(pending)
