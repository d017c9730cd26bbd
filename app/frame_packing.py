"""Large MessagePack frames packed into a buffer that is kept, not mapped afresh.

Rule: the stream's ``deliver`` frames (up to a thousand messages, a MiB and more each)
are packed by the app's one ``FramePacker``, whose packer keeps its buffer from one frame
to the next, and the frame is handed on as a view of that buffer, not copied out of it.
The server's malloc gives every buffer over 64 KiB a mapping of its own
(``app/server.py`` ``tune_malloc``), and touching the pages of a fresh MiB cost this
machine more than packing into it: ``msgpack.packb`` of a delivery of a thousand 1 KiB
messages took 3.5-4.5 us per message under that setting, the kept packer 1.3-2.4 when
it copied its frame out into a new ``bytes`` (0.5 either way under glibc's defaults).

A view keeps its buffer as it is: msgpack refuses to change a packer's buffer while a
view of it lives (``BufferError``), so a frame still being written by the transport (or
held by anyone) is never overwritten; the next frame then gets a new packer. Packing is
synchronous, so one packer serves the whole event loop. A frame that grew the buffer
past ``PACKER_BYTES_MAX`` gives it back (the next frame gets a new packer), so that at
most that much stays allocated.
"""

from __future__ import annotations

import msgpack

PACKER_BYTES_MAX = 8 << 20
"""The largest packed frame whose buffer is kept for the next (about 6,000 messages of
1 KiB)."""


class FramePacker:
    """Packs frames with a packer that is reused while its frames stay small enough and
    no view of its last frame lives."""

    __slots__ = ("_bytes_max", "_packer")

    def __init__(self, bytes_max: int = PACKER_BYTES_MAX) -> None:
        assert bytes_max >= 1
        self._bytes_max = bytes_max
        self._packer: msgpack.Packer | None = None

    def pack(self, frame: object) -> memoryview:
        """The bytes of ``msgpack.packb(frame, use_bin_type=True)``, as a view of the
        kept packer's buffer. The view stays valid as long as it is held."""
        packer = self._reusable() or msgpack.Packer(use_bin_type=True, autoreset=False)
        self._packer = None  # a packer that fails midway is not used again
        packer.pack(frame)
        view: memoryview = packer.getbuffer()
        if len(view) <= self._bytes_max:
            self._packer = packer
        return view

    def _reusable(self) -> msgpack.Packer | None:
        """The kept packer, emptied; None when there is none or a view of its last
        frame still lives."""
        packer = self._packer
        if packer is None:
            return None
        try:
            packer.reset()
        except BufferError:
            self._packer = None
            return None
        return packer


__all__ = ["PACKER_BYTES_MAX", "FramePacker"]
