"""Helpers of the compaction tests: a storage on a fake disk filled with entries whose
liveness the test chooses, a queue machine driven through the real storage, and checks
that nothing live is lost and no file is left over."""

from __future__ import annotations

import dataclasses
import random

from pyroaring import BitMap64

from engine.limits import DEFAULT_LIMITS, KIB, Limits
from engine.queue import (
    NewMessage,
    QueuePolicy,
    encode_checkout,
    encode_enqueue,
    encode_return,
    encode_settle,
)
from engine.queue.effects import CheckedOut
from engine.queue.machine import QueueMachine
from engine.raft.entry import Entry, EntryKind
from engine.raft.state_machine import ApplyMeta
from engine.storage import Checkpoint, Disk, NodeStorage
from engine.storage.segment import segment_dir

UID = "q"


def limits(**change: int) -> Limits:
    base = {
        "wal_file_bytes_max": 64 * KIB,
        "wal_batch_bytes_max": 16 * KIB,
        "entry_bytes_max": 1 * KIB,
        "segment_entries_max": 16,
        "segment_file_bytes_max": 2 * KIB,
        "segment_readers_open_max": 4,
        "checkpoints_kept_max": 3,
        "batch_bytes_max": 512,
        "message_bytes_max": 256,
        "message_bytes_max_ceiling": 512,
    }
    base.update(change)
    return dataclasses.replace(DEFAULT_LIMITS, **base)


def payload(index: int, size: int = 40) -> bytes:
    return f"entry-{index}-".encode().ljust(size, b"#")


def fill(disk: Disk, lim: Limits, n: int, *, size: int = 40) -> NodeStorage:
    """A storage whose server ``UID`` holds entries ``1..n`` in segments (a clean stop
    flushed them all), opened again."""
    storage = NodeStorage.open(disk, lim)
    storage.open_server(UID)
    for lo in range(1, n + 1, 8):
        batch = [
            Entry(i, 1, EntryKind.COMMAND, i, payload(i, size))
            for i in range(lo, min(n, lo + 7) + 1)
        ]
        storage.append(UID, batch)
        storage.sync()
    storage.close()
    return reopen(disk, lim)


def reopen(disk: Disk, lim: Limits) -> NodeStorage:
    storage = NodeStorage.open(disk, lim)
    storage.open_server(UID)
    return storage


def checkpoint(storage: NodeStorage, index: int, live: BitMap64, state: bytes = b"") -> None:
    storage.write_checkpoint(UID, Checkpoint(index, 1, 0, b"", live, state))


def assert_intact(
    storage: NodeStorage, live: BitMap64, snap: int, expected: dict[int, bytes] | None = None
) -> None:
    """Every live entry and every entry after the snapshot reads back intact; the segment
    directory holds exactly the segments of the view."""
    log = storage.log(UID)
    assert log.snapshot_index() == snap
    for index in live:
        want = expected[index] if expected is not None else payload(index)
        assert log.read(index).data == want, index
    for index in range(snap + 1, log.last_index() + 1):
        want = expected[index] if expected is not None else payload(index)
        assert log.read(index).data == want, index
    assert_no_orphans(storage)


def assert_no_orphans(storage: NodeStorage) -> None:
    directory = segment_dir(UID)
    on_disk = sorted(storage.disk.listdir(directory))
    in_view = sorted(info.path.rsplit("/", 1)[1] for info, _ in storage.log(UID).segment_infos())
    assert on_disk == in_view


def dead_and_live(storage: NodeStorage) -> tuple[int, int]:
    stats = storage.segment_stats(UID)
    return sum(s.dead for s in stats), sum(s.live for s in stats)


class QueueDriver:
    """A queue machine whose commands go through the real storage, one entry each."""

    def __init__(self, storage: NodeStorage, rng: random.Random, priorities: int = 4) -> None:
        self.storage = storage
        self.rng = rng
        self.machine = QueueMachine(QueuePolicy(priorities=priorities, delivery_limit=None))
        self.index = 0
        self.now_ms = 1_000
        self.data: dict[int, bytes] = {}
        self.leased: list[tuple[int, int]] = []

    def command(self, data: bytes) -> object:
        self.index += 1
        self.now_ms += 1
        self.storage.append(UID, [Entry(self.index, 1, EntryKind.COMMAND, self.now_ms, data)])
        self.storage.sync()
        self.data[self.index] = data
        reply, _ = self.machine.apply(ApplyMeta(self.index, 1, self.now_ms), data)
        return reply

    def publish(self, n: int, *, delay_ms: int = 0) -> None:
        for _ in range(n):
            body = f"m{self.index}".encode() * self.rng.randrange(1, 6)
            priority = self.rng.randrange(4)
            self.command(encode_enqueue([NewMessage(body, priority=priority, delay_ms=delay_ms)]))

    def receive(self, n: int) -> None:
        reply = self.command(encode_checkout("c", n, 60_000))
        assert isinstance(reply, CheckedOut)
        self.leased.extend(zip(reply.tags, reply.refs, strict=True))

    def settle_random(self, fraction: float) -> None:
        self.rng.shuffle(self.leased)
        k = int(len(self.leased) * fraction)
        done, self.leased = self.leased[:k], self.leased[k:]
        for at in range(0, len(done), 7):
            self.command(encode_settle(done[at : at + 7]))

    def return_random(self, fraction: float) -> None:
        self.rng.shuffle(self.leased)
        k = int(len(self.leased) * fraction)
        back, self.leased = self.leased[:k], self.leased[k:]
        if back:
            self.command(encode_return(back))

    def checkpoint(self) -> BitMap64:
        live = self.machine.live_indexes()
        cp = Checkpoint(self.index, 1, QueueMachine.version, b"", live, self.machine.snapshot())
        self.storage.write_checkpoint(UID, cp)
        return live
