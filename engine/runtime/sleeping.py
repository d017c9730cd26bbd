"""A sleeping queue: the compact record an idle replica is swapped for (issue 17; the
node's side, when and how, is ``engine.runtime.hibernation``).

An idle queue's resident form (machine, Raft server, log, lanes, tables) costs several
KiB even when it holds ten messages; what must survive an idle spell is far smaller: the
machine's snapshot bytes (the same inline format 2 that replicas compare and a follower is
sent, ``QueueMachine.snapshot``), the Raft positions a rebuilt replica starts from, and
the stats the dashboard, ``GET /queues/{name}`` and ``/metrics`` read, so a sleeping queue
is described without waking it.

Rules of this module: pure, no I/O; a record is immutable and taken only from a machine
that ``may_sleep`` (nothing it would do on its own later: no leases out, no delayed
messages, no TTL, no dead letters in flight, so no timer of it can come due while it
sleeps); ``wake`` gives a machine that behaves exactly as the one put to sleep (same
deliveries, receipts and snapshot bytes: ``tests/engine/runtime/test_sleeping.py``).

Leases are not kept inside the record: a lease out has a deadline (a timer) and its
consumer is likely to settle it soon, so such a queue is not idle; this keeps the
record's only machine state the snapshot bytes, and a sleeping queue timer-free.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import NamedTuple, cast

import msgpack

from engine.ids import ServerId
from engine.limits import DEFAULT_LIMITS, Limits
from engine.queue import QueueMachine
from engine.queue.paging import Paging, PagingStats
from engine.queue.stats import MemoryUse, QueueStats
from engine.raft.config import Configuration
from engine.raft.server import RaftServer
from engine.shared_empty import shared


@dataclasses.dataclass(frozen=True, slots=True)
class RaftPositions:
    """What a replica rebuilt after sleeping starts its Raft server from."""

    term: int
    vote: ServerId | None
    commit: int
    applied: int
    last_index: int
    last_term: int
    configuration: Configuration


def raft_positions(raft: RaftServer) -> RaftPositions:
    return RaftPositions(
        term=raft.term,
        vote=raft.vote,
        commit=raft.commit,
        applied=raft.applied,
        last_index=raft.log.last_index(),
        last_term=raft.log.last_term(),
        configuration=raft.config,
    )


@dataclasses.dataclass(frozen=True, slots=True)
class SleepingQueue:
    """One idle queue, compact: ``snapshot`` is the machine's state, ``stats`` what it
    reported when it fell asleep (nothing changes it until it wakes), kept packed
    (``pack_stats``: about 80 bytes where the objects took 430). Made by ``of``."""

    head: bytes
    """The snapshot's first bytes, through its policy: one object for every sleeping
    queue of the same policy (about 200 of a small queue's 300 snapshot bytes)."""
    rest: bytes
    """The snapshot after its policy."""
    packed_stats: bytes
    raft: RaftPositions | None

    @classmethod
    def of(cls, snapshot: bytes, packed_stats: bytes, raft: RaftPositions | None) -> SleepingQueue:
        head, rest = _split_policy(snapshot)
        return cls(head, rest, packed_stats, raft)

    @property
    def snapshot(self) -> bytes:
        """The machine's snapshot bytes (``QueueMachine.snapshot``), whole."""
        return self.head + self.rest

    @property
    def stats(self) -> QueueStats:
        return unpack_stats(self.packed_stats)


def _split_policy(snapshot: bytes) -> tuple[bytes, bytes]:
    """``snapshot`` cut after its policy (its third item: the array's header, the format
    version, the policy map), the head shared with equal heads of other records."""
    unpacker = msgpack.Unpacker()
    unpacker.feed(snapshot)
    unpacker.read_array_header()
    unpacker.skip()  # the version
    unpacker.skip()  # the policy
    at = unpacker.tell()
    return shared(snapshot[:at]), snapshot[at:]


MEMORY_FIELDS = tuple(f.name for f in dataclasses.fields(MemoryUse))
"""The parts of ``memory_bytes`` in the stats' ``memory`` (``MemoryUse``'s fields, in order):
the packed stats hold them so, and every summary names them."""
_PAGING_FIELDS = tuple(f.name for f in dataclasses.fields(PagingStats))
_STATS_FIELDS = tuple(
    f.name for f in dataclasses.fields(QueueStats) if f.name not in ("memory", "paging")
)


def pack_stats(stats: QueueStats) -> bytes:
    """``stats`` as one msgpack array of its fields, ``memory``'s and ``paging``'s last."""
    fields: list[object] = [getattr(stats, name) for name in _STATS_FIELDS]
    fields += [getattr(stats.memory, name) for name in MEMORY_FIELDS]
    fields += [getattr(stats.paging, name) for name in _PAGING_FIELDS]
    return cast(bytes, msgpack.packb(fields))


_SUMMARY_AT = tuple(
    _STATS_FIELDS.index(name)
    for name in ("messages_ready", "messages_unacked", "bytes_ready", "consumers", "memory_bytes")
)


class SummaryFields(NamedTuple):
    """What ``observe.queue_summary`` reports of a queue beside its rates."""

    messages_ready: int
    messages_unacked: int
    bytes_ready: int
    consumers: dict[str, int]
    memory_bytes: int
    memory: dict[str, int]


def summary_fields(packed: bytes) -> SummaryFields:
    """``SummaryFields`` of a sleeping queue, read from its packed stats without making
    their objects: the dashboard's sampler reads every queue every few seconds, and
    10,000 sleeping queues' ``QueueStats`` took about 6% of an idle server's CPU."""
    fields = msgpack.unpackb(packed)
    ready, unacked, bytes_ready, consumers, memory_bytes = (fields[at] for at in _SUMMARY_AT)
    n = len(_STATS_FIELDS)
    memory = dict(zip(MEMORY_FIELDS, fields[n : n + len(MEMORY_FIELDS)], strict=True))
    return SummaryFields(ready, unacked, bytes_ready, dict(consumers), memory_bytes, memory)


def unpack_stats(packed: bytes) -> QueueStats:
    fields = msgpack.unpackb(packed)
    n, m = len(_STATS_FIELDS), len(MEMORY_FIELDS)
    memory = MemoryUse(*fields[n : n + m])
    paging = PagingStats(*fields[n + m :])
    own = dict(zip(_STATS_FIELDS, fields[:n], strict=True))
    return QueueStats(**own, memory=memory, paging=paging)


_POSITIONS = struct.Struct("<QQ")
"""The applied index and term at the front of a ``Dormant``'s packed bytes."""


class Dormant:
    """What a hosted replica keeps of itself while it sleeps: the record, where its
    machine was applied to, and its live set (``BitMap64.serialize``: the log stats of a
    sleeping queue read it, and a woken one starts from it).

    Held as two objects made when the queue falls asleep: the snapshot's policy head
    (shared, ``SleepingQueue.head``) and one ``bytes`` of all the rest (the applied
    index and term, then a msgpack array of the snapshot's tail, the packed stats, the
    Raft positions and the live set). What a sleeping queue keeps must be few objects,
    and none of them made while it was awake: those lie among the objects of its awake
    spell in the allocator's arenas, and one such survivor keeps a whole arena of freed
    space from going back to the system (about 2.5 KB a queue when thousands of queues
    fall asleep together). Reads unpack what they ask for, each time."""

    __slots__ = ("head", "packed")

    def __init__(
        self, record: SleepingQueue, applied_index: int, applied_term: int, live: bytes
    ) -> None:
        pos = record.raft
        raft: list[object] | None = None
        if pos is not None:
            raft = [pos.term, pos.vote, pos.commit, pos.applied, pos.last_index, pos.last_term]
            raft.append(pos.configuration.encode())
        fields = (record.rest, record.packed_stats, raft, live)
        self.head = record.head
        self.packed = _POSITIONS.pack(applied_index, applied_term) + cast(
            bytes, msgpack.packb(fields)
        )

    @classmethod
    def of_packed(cls, head: bytes, packed: bytes) -> Dormant:
        """The record ``head`` and ``packed`` are the two objects of (as a clean stop saves
        them, ``engine.runtime.sleepers``): nothing is unpacked or packed again, and the
        head is shared with the equal heads of other records."""
        dormant = cls.__new__(cls)
        dormant.head = shared(head)
        dormant.packed = packed
        return dormant

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Dormant):
            return NotImplemented
        return (self.head, self.packed) == (other.head, other.packed)

    def __hash__(self) -> int:
        return hash((self.head, self.packed))

    def _fields(self) -> list[object]:
        return cast(list[object], msgpack.unpackb(memoryview(self.packed)[_POSITIONS.size :]))

    @property
    def applied_index(self) -> int:
        return cast(int, _POSITIONS.unpack_from(self.packed)[0])

    @property
    def applied_term(self) -> int:
        return cast(int, _POSITIONS.unpack_from(self.packed)[1])

    @property
    def record(self) -> SleepingQueue:
        return self.unpacked()[0]

    def unpacked(self) -> tuple[SleepingQueue, bytes]:
        """The record and the live set, from one unpacking (what a wake reads)."""
        rest, stats, raft, live = self._fields()
        positions = None
        if raft is not None:
            term, vote, commit, applied, last_index, last_term, config = cast(list[object], raft)
            positions = RaftPositions(
                cast(int, term),
                None if vote is None else ServerId(cast(str, vote)),
                cast(int, commit),
                cast(int, applied),
                cast(int, last_index),
                cast(int, last_term),
                Configuration.decode(cast(bytes, config)),
            )
        record = SleepingQueue(self.head, cast(bytes, rest), cast(bytes, stats), positions)
        return record, cast(bytes, live)

    def log_positions(self) -> tuple[int, str | None, int, int, int] | None:
        """(term, vote, commit, last index, last term) of its Raft positions, if it has
        them, without the rest of the record (what ``sleepers.matches`` checks)."""
        raft = self._fields()[2]
        if raft is None:
            return None
        term, vote, commit, _applied, last_index, last_term, _config = cast(list[object], raft)
        return (
            cast(int, term),
            cast("str | None", vote),
            cast(int, commit),
            cast(int, last_index),
            cast(int, last_term),
        )

    @property
    def packed_stats(self) -> bytes:
        """The record's packed stats (``pack_stats``), without the rest of it."""
        return cast(bytes, self._fields()[1])

    @property
    def live(self) -> bytes:
        return cast(bytes, self._fields()[3])

    @property
    def stats(self) -> QueueStats:
        return unpack_stats(self.packed_stats)

    @property
    def record_bytes(self) -> int:
        """What the record holds (the memory alarm's count of a sleeping queue)."""
        return len(self.head) + len(self.packed)


def may_sleep(machine: QueueMachine) -> bool:
    """True when nothing in ``machine`` waits on time or on a consumer: no leases out,
    no delayed or expiring messages, no dead letters awaiting their target queue."""
    return machine.at_rest()


def put_to_sleep(machine: QueueMachine, raft: RaftPositions | None = None) -> SleepingQueue:
    """The record of ``machine`` (which the caller then drops)."""
    assert may_sleep(machine), "a queue with timers or leases out does not sleep"
    return SleepingQueue.of(machine.snapshot(), pack_stats(machine.stats()), raft)


def wake(
    record: SleepingQueue, limits: Limits = DEFAULT_LIMITS, paging: Paging | None = None
) -> QueueMachine:
    """A machine restored from ``record``: its policy comes from the snapshot."""
    return QueueMachine(None, limits, paging, record.snapshot)
