"""The forms of a page of packed references: hot (a numpy ``uint64`` array), sealed and
spilled, and the stored form of a page (``engine.queue.pages`` keeps them in FIFOs).

Rule of this module: values and pure conversions only. A *sealed* page is a full page
kept as its first ref plus int32 deltas (4 bytes per message instead of 8) when every
step between neighbouring refs fits in a signed 32-bit integer; deltas are taken modulo
2^64, so the round trip is exact for every form of ref. A *spilled* page
(``SpilledPage``) stands for a full page whose refs are in a page store: it keeps what
the machine needs without the refs (count, bytes, the Raft indexes they name) and,
while it is loaded again, the page itself. ``encode_page`` and ``decode_page`` are the
stored form, sealed when the steps allow.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import cast

import numpy as np
import numpy.typing as npt
from pyroaring import BitMap64

U64 = npt.NDArray[np.uint64]
_ARRAY_HEADER_BYTES = 112
_SPILLED_PAGE_BYTES = 240
"""What a ``SpilledPage`` costs besides its index set: the object, its ints and bytes."""
_Wire = tuple[int, int, int, int, int, int, int, int, bytes]
"""``SpilledPage.to_wire``: handle, count, crc, first, last, size_bytes, index_lo,
index_hi, indexes."""
_I32_MIN = -(1 << 31)
_I32_MAX = (1 << 31) - 1
_PAGE_HEAD = struct.Struct("<BxxxIQ")
"""Stored page: form (0 raw u64 refs, 1 sealed: int32 deltas), ref count, first ref."""
_FORM_RAW = 0
_FORM_SEALED = 1


class SealedPage:
    """A full page stored as its first ref and the int32 steps between neighbours."""

    __slots__ = ("deltas", "first")

    def __init__(self, first: int, deltas: npt.NDArray[np.int32]) -> None:
        self.first = first
        self.deltas = deltas

    @classmethod
    def maybe_seal(cls, page: U64) -> SealedPage | None:
        steps = np.diff(page).view(np.int64)
        if len(steps) and (steps.min() < _I32_MIN or steps.max() > _I32_MAX):
            return None
        return cls(int(page[0]), steps.astype(np.int32))

    def expand(self) -> U64:
        out = np.empty(len(self.deltas) + 1, dtype=np.uint64)
        out[0] = self.first
        np.cumsum(self.deltas.astype(np.int64).view(np.uint64), out=out[1:])
        out[1:] += np.uint64(self.first)
        return out

    def nbytes(self) -> int:
        return int(self.deltas.nbytes) + _ARRAY_HEADER_BYTES + 56


class SpilledPage:
    """A full page whose refs are in a page store under ``handle`` (see the module's
    rule). Everything but ``resident`` and ``prefetched`` is fixed when it is made."""

    __slots__ = (
        "count",
        "crc",
        "first",
        "handle",
        "index_hi",
        "index_lo",
        "indexes",
        "last",
        "prefetched",
        "resident",
        "size_bytes",
    )

    def __init__(
        self,
        handle: int,
        count: int,
        crc: int,
        first: int,
        last: int,
        size_bytes: int,
        index_lo: int,
        index_hi: int,
        indexes: bytes,
    ) -> None:
        self.handle = handle
        self.count = count
        self.crc = crc
        """CRC32C of the stored form (``encode_page``): checked on every load, and what a
        page rebuilt from the log must match."""
        self.first = first
        self.last = last
        self.size_bytes = size_bytes
        """Sum of the sizes of its messages (the machine's ``bytes_ready`` share)."""
        self.index_lo = index_lo
        self.index_hi = index_hi
        self.indexes = indexes
        """The Raft indexes its refs name, a serialized ``BitMap64`` (run containers: tens
        of bytes for a page of consecutive entries)."""
        self.resident: U64 | SealedPage | None = None
        """The page itself while it is loaded."""
        self.prefetched = False
        """Loaded by read-ahead and not yet reached by the head."""

    def index_set(self) -> BitMap64:
        return BitMap64.deserialize(self.indexes)

    def nbytes(self) -> int:
        held = self.resident
        page = 0 if held is None else nbytes(held)
        return _SPILLED_PAGE_BYTES + len(self.indexes) + page

    def to_wire(self) -> list[object]:
        return [
            self.handle,
            self.count,
            self.crc,
            self.first,
            self.last,
            self.size_bytes,
            self.index_lo,
            self.index_hi,
            self.indexes,
        ]

    @classmethod
    def from_wire(cls, wire: Sequence[object]) -> SpilledPage:
        # A restore makes one per stored page (12,000 at 50 million messages): the shape
        # is checked, not the type of each number, which cost more than the page itself
        # (the wire comes from a checkpoint that passed its CRC32C).
        handle, count, crc, first, last, size_bytes, lo, hi, indexes = cast(_Wire, wire)
        assert isinstance(indexes, bytes) and isinstance(handle, int), wire
        return cls(handle, count, crc, first, last, size_bytes, lo, hi, indexes)


Page = U64 | SealedPage | SpilledPage
PageReader = Callable[[SpilledPage], U64]


def encode_page(page: U64 | SealedPage) -> bytes:
    """The stored form of a full page: sealed (4 bytes a ref) when its steps allow."""
    if not isinstance(page, SealedPage):
        page = SealedPage.maybe_seal(page) or page
    if isinstance(page, SealedPage):
        head = _PAGE_HEAD.pack(_FORM_SEALED, len(page.deltas) + 1, page.first)
        return head + page.deltas.tobytes()
    return _PAGE_HEAD.pack(_FORM_RAW, len(page), 0) + page.tobytes()


def decode_page(data: bytes) -> U64 | SealedPage:
    """The page ``encode_page`` stored (read-only views into ``data``); ``ValueError`` if
    ``data`` is not one."""
    if len(data) < _PAGE_HEAD.size:
        raise ValueError("page too short")
    form, count, first = _PAGE_HEAD.unpack_from(data)
    body = len(data) - _PAGE_HEAD.size
    if form == _FORM_SEALED and count >= 1 and body == 4 * (count - 1):
        return SealedPage(first, np.frombuffer(data, np.int32, count - 1, _PAGE_HEAD.size))
    if form == _FORM_RAW and body == 8 * count:
        return np.frombuffer(data, np.uint64, count, _PAGE_HEAD.size)
    raise ValueError("not a stored page")


def hot(page: U64 | SealedPage) -> U64:
    return page.expand() if isinstance(page, SealedPage) else page


def nbytes(page: U64 | SealedPage) -> int:
    if isinstance(page, SealedPage):
        return page.nbytes()
    return int(page.nbytes) + _ARRAY_HEADER_BYTES


def refs_of(page: Page, read: PageReader | None) -> U64:
    if isinstance(page, np.ndarray):
        return page
    if isinstance(page, SealedPage):
        return page.expand()
    held = page.resident
    if held is not None:
        return hot(held)
    assert read is not None, "a spilled page needs a pager to be read"
    return read(page)


__all__ = [
    "U64",
    "Page",
    "PageReader",
    "SealedPage",
    "SpilledPage",
    "decode_page",
    "encode_page",
    "hot",
    "nbytes",
    "refs_of",
]
