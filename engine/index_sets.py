"""Sets of Raft indexes (``BitMap64``) built from numpy arrays.

Rule: build them with ``index_set``. pyroaring takes an ``array.array`` of unsigned 64-bit
integers in one call into C; handed a numpy array or a list it adds the values one by
one, and ``np.unique`` before it (a sort in numpy 2.4) costs seconds for millions of
values. A queue of millions of messages builds such a set whenever its live entries are
counted, on the event loop: 5 million references took 5.6 s the old way and about a
tenth of a second this way (see ``tests/engine/queue/test_index_sets.py``).
"""

from __future__ import annotations

from array import array

import numpy as np
import numpy.typing as npt
from pyroaring import BitMap64


def index_set(indexes: npt.NDArray[np.uint64]) -> BitMap64:
    """The set of ``indexes``: any order, repeats allowed."""
    out = BitMap64()
    add_indexes(out, indexes)
    return out


def add_indexes(target: BitMap64, indexes: npt.NDArray[np.uint64]) -> None:
    """Add ``indexes`` to ``target``. Feeding a large set chunk by chunk (a page of refs
    at a time) keeps every temporary array small and in the CPU cache."""
    if len(indexes):
        flat = np.ascontiguousarray(indexes, dtype=np.uint64)
        target.update(array("Q", flat.tobytes()))


__all__ = ["add_indexes", "index_set"]
