"""pydyad: Python bindings for DYAD (producer/consumer file movement).

Quick use (settings from DYAD_* environment variables)::

    from pydyad import Dyad, dyad_open
    with dyad_open("/dmd/out/frame0.npy", "wb") as f:   # published on close
        f.write(data)
    with dyad_open("/dmd/in/frame0.npy", "rb") as f:    # waits, fetches, opens
        data = f.read()

See docs/python.md. ``pydyad.hdf.DyadFile`` (h5py) and
``pydyad.data.DyadDataset`` (torch) are imported on demand so that pydyad
works without h5py or torch.
"""

from .bindings import (DYAD_CHECK_ENV, DTLCommMode, DTLMode, Dyad, DyadError, DyadMetadata,
                       RawMetadata)
from .context import dyad_open, default_dyad

__all__ = [
    "DYAD_CHECK_ENV", "DTLCommMode", "DTLMode", "Dyad", "DyadError", "DyadMetadata", "RawMetadata",
    "dyad_open", "default_dyad",
]
__version__ = "0.2.0"
