"""The sleeping queues' records, kept across a clean stop (issue 17): a restart brings
an idle queue back asleep, as the compact record it was, without building its machine,
Raft core and driver, applying its log or electing it; the first request wakes it as
after any sleep (``engine.runtime.hibernation``).

A clean stop writes one file, ``sleepers``, after the storage closed: every sleeping
lone-voter queue's ``Dormant`` record (its two packed objects as they are: the start
makes the record from them without unpacking it) and its page files' bookkeeping, packed
(``PageFiles.pack``: nothing writes a sleeping queue's page files, so it is what their
directory holds and the start need not list it). The next
start reads it and removes it (the directory synced) before anything of that run
writes, so the file speaks only for the disk exactly as the stop left it: a crash at
any later instant finds no file and recovers every queue from its log as before. A
crash during the stop leaves no file (or the temporary one, removed) for the same
reason: it is renamed into place last.

A record is used only when its queue's storage agrees with it, checked after its log
was opened and its tail checked like any other (``matches``): same term and vote in
the hard state, same last index and term, a log that is not being repaired, and an
applied index at the end of it. A record that disagrees (a file from another run put
back by hand, a log changed since) is dropped and the queue recovered from its log.
Why the record may stand for the log without the start-up election's entry: it was
taken from a lone voter that led with every entry of its log committed and applied
(``Hibernation.idle``); the log is the same, so its entries are still committed (a
quorum of one holds them durably), and the term and vote it leads in again at its wake
(``RaftServer.resume_as_sole_leader``) are the durable ones, with every entry it appended
in that term stored: it slept with nothing unwritten, and a run that wrote more of it
either slept it again at its stop (a new record) or left it out of the file.

Rules of this module: encoding and decoding are pure; the two disk functions use the
``Disk`` interface only. The file is one msgpack array behind a magic and a CRC32C of
its body, at most ``Limits.sleepers_bytes_max`` (records past it are left out: their
queues recover from their logs). A file of another version is dropped as a damaged one
(its queues recover from their logs, once).
"""

from __future__ import annotations

import dataclasses
import logging
import struct
from typing import cast

import crc32c
import msgpack

from engine.runtime.sleeping import Dormant
from engine.storage.disk import Disk, parent, write_file_atomic
from engine.storage.storage_events import Recovered

log = logging.getLogger("quorra.engine")

SLEEPERS_PATH = "sleepers"
_MAGIC = b"QSLP\x02"
_HEADER = struct.Struct("<5sI")
"""Magic with its version, CRC32C of the body."""


@dataclasses.dataclass(frozen=True, slots=True)
class Sleeper:
    """One queue's record as the stop left it."""

    uid: str
    dormant: Dormant
    bytes_since_capture: int
    """What a restart from its log would apply again (the replica's counter)."""
    pages: bytes
    """Its page files' bookkeeping, packed (``PageFiles.pack``)."""


def encode_sleepers(sleepers: list[Sleeper], bytes_max: int) -> bytes:
    """The file's bytes: as many records as fit in ``bytes_max``, in order."""
    rows: list[object] = []
    size = _HEADER.size + 16
    for s in sleepers:
        d = s.dormant
        row = [s.uid, d.head, d.packed, s.bytes_since_capture, s.pages]
        row_bytes = len(cast(bytes, msgpack.packb(row)))
        if size + row_bytes > bytes_max:
            break
        size += row_bytes
        rows.append(row)
    body = cast(bytes, msgpack.packb(rows))
    return _HEADER.pack(_MAGIC, crc32c.crc32c(body)) + body


def decode_sleepers(data: bytes | memoryview) -> dict[str, Sleeper]:
    """The records by queue uid; ``ValueError`` if the file is not whole and ours."""
    if len(data) < _HEADER.size:
        raise ValueError("sleepers file too short")
    magic, crc = _HEADER.unpack_from(data)
    body = bytes(data[_HEADER.size :])
    if magic != _MAGIC or crc32c.crc32c(body) != crc:
        raise ValueError("sleepers file: bad magic or CRC")
    out: dict[str, Sleeper] = {}
    for uid, head, packed, since, pages in msgpack.unpackb(body):
        out[uid] = Sleeper(uid, Dormant.of_packed(head, packed), since, pages)
    return out


def matches(sleeper: Sleeper, rec: Recovered) -> bool:
    """Whether the opened storage ``rec`` is the log ``sleeper`` was taken from, all of it
    applied (see the module's rules)."""
    pos = sleeper.dormant.log_positions()
    hs = rec.hard_state
    if pos is None or hs is None or rec.repairing or rec.damaged:
        return False
    term, vote, commit, last_index, last_term = pos
    server_log = rec.log
    last = server_log.last_index()
    return (
        (hs.term, hs.vote) == (term, vote)
        and (last, server_log.term(last)) == (last_index, last_term)
        and commit == last
        and sleeper.dormant.applied_index == last
        and server_log.snapshot_index() <= last
    )


def write_sleepers(disk: Disk, data: bytes) -> None:
    """After a clean stop closed the storage: the file, atomically."""
    write_file_atomic(disk, SLEEPERS_PATH, data)


def take_sleepers(disk: Disk) -> dict[str, Sleeper]:
    """At start, before anything writes: the records the last stop left, and the file
    removed for good (its directory synced), so that no later run can read it. Nothing
    (and the file still removed if it can be) when it is absent, damaged or cannot be
    removed: every queue then recovers from its log."""
    tmp = SLEEPERS_PATH + ".tmp"
    if disk.exists(tmp):
        disk.remove(tmp)
    if not disk.exists(SLEEPERS_PATH):
        return {}
    try:
        sleepers = decode_sleepers(disk.read(SLEEPERS_PATH))
    except (ValueError, msgpack.UnpackException, TypeError) as e:
        log.warning("start: sleeping queues' records unreadable, recovered from logs: %s", e)
        sleepers = {}
    try:
        disk.remove(SLEEPERS_PATH)
        disk.sync_dir(parent(SLEEPERS_PATH))
    except OSError as e:
        log.warning("start: sleeping queues' records not removed, not used: %s", e)
        return {}
    return sleepers


__all__ = [
    "SLEEPERS_PATH",
    "Sleeper",
    "decode_sleepers",
    "encode_sleepers",
    "matches",
    "take_sleepers",
    "write_sleepers",
]
