"""What of a file is in the page cache, read with ``mincore`` (tests on real disks)."""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
from pathlib import Path

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]


def resident(path: Path) -> list[bool]:
    """For each page of the file, whether it is in the page cache (``mincore``)."""
    size = path.stat().st_size
    pages = -(-size // mmap.PAGESIZE)
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        try:
            vec = ctypes.create_string_buffer(pages)
            assert _libc.mincore(addr, size, vec) == 0, os.strerror(ctypes.get_errno())
            return [bool(b & 1) for b in vec.raw]
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)
