"""Large MessagePack frames packed into a buffer that is kept, not mapped afresh.

Rule: the stream's ``deliver`` frames (up to a thousand messages, a MiB and more each)
are packed by the app's one ``FramePacker``, whose packer keeps its buffer from one frame
to the next. The server's malloc gives every buffer over 64 KiB a mapping of its own
(``app/server.py`` ``tune_malloc``), and touching the pages of a fresh MiB cost this
machine more than packing into it: ``msgpack.packb`` of a delivery of a thousand 1 KiB
messages took 3.5-4.5 us per message under that setting, the kept packer 1.3-2.4
(0.5 either way under glibc's defaults). Packing is synchronous, so one packer serves
the whole event loop. A frame that grew the buffer past ``PACKER_BYTES_MAX`` gives it
back (the next frame gets a new packer), so that at most that much stays allocated.
"""

from __future__ import annotations

import msgpack

PACKER_BYTES_MAX = 8 << 20
"""The largest packed frame whose buffer is kept for the next (about 6,000 messages of
1 KiB)."""


class FramePacker:
    """Packs frames with a packer that is reused while its frames stay small enough."""

    __slots__ = ("_bytes_max", "_packer")

    def __init__(self, bytes_max: int = PACKER_BYTES_MAX) -> None:
        assert bytes_max >= 1
        self._bytes_max = bytes_max
        self._packer: msgpack.Packer | None = None

    def pack(self, frame: object) -> bytes:
        """``msgpack.packb(frame, use_bin_type=True)``, through the kept packer."""
        packer = self._packer or msgpack.Packer(use_bin_type=True)
        self._packer = None  # a packer that fails midway is not used again
        packed: bytes = packer.pack(frame)
        if len(packed) <= self._bytes_max:
            self._packer = packer
        return packed


__all__ = ["PACKER_BYTES_MAX", "FramePacker"]
