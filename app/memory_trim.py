"""Free heap given back to the system, now and then, on a worker thread.

glibc keeps the freed space of small allocations in its arenas (``app/server.py``'s
``tune_malloc`` sends large buffers to mappings of their own, returned when freed): a
server idle after taking a million messages of 1 KiB kept 31-35 B per message of
anonymous memory, 13 B with this trim (``quorra bench restart``). ``malloc_trim`` returns the free pages inside the
arenas as well as at their tops; it walks the free chunks, a few milliseconds for a heap
of tens of MiB, so it runs on a worker, every ``TRIM_INTERVAL_S``. Nothing happens where
the C library is not glibc.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
from collections.abc import Callable

import anyio

TRIM_INTERVAL_S = 10.0


def libc() -> ctypes.CDLL | None:
    """The C library, or None where it cannot be loaded."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c"))
    except (OSError, TypeError):
        return None


def malloc_trim() -> Callable[[], object] | None:
    """glibc's ``malloc_trim(0)``, or None where there is none."""
    trim = getattr(libc(), "malloc_trim", None)
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: trim(0)


async def trim_forever(interval_s: float = TRIM_INTERVAL_S) -> None:
    """Trim every ``interval_s`` until cancelled (the app's lifespan runs it)."""
    trim = malloc_trim()
    if trim is None:
        return
    while True:
        await asyncio.sleep(interval_s)
        await anyio.to_thread.run_sync(trim)


__all__ = ["TRIM_INTERVAL_S", "malloc_trim", "trim_forever"]
