"""A crash at every disk operation of each phase loses nothing and leaves no file the log
does not use, once recovered; compaction after recovery converges to the same result."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from pyroaring import BitMap64

from engine.storage import FakeDisk, NodeStorage
from engine.storage.compaction import Phase
from tests.engine.storage.compaction.conftest import (
    UID,
    assert_intact,
    checkpoint,
    dead_and_live,
    fill,
    limits,
    reopen,
)

LIMITS = limits()


class Crash(BaseException):
    """Power is lost at this disk operation (nothing catches it on the way up)."""


class CrashingDisk(FakeDisk):
    """A fake disk that crashes at its ``crash_at``-th changing operation."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0
        self.crash_at: int | None = None

    def _tick(self) -> None:
        self.ops += 1
        if self.crash_at is not None and self.ops >= self.crash_at:
            self.crash_at = None
            raise Crash

    def before_write(self, growth_bytes: int) -> None:
        self._tick()
        super().before_write(growth_bytes)

    def remove(self, path: str) -> None:
        self._tick()
        super().remove(path)


Setup = Callable[[CrashingDisk], tuple[NodeStorage, BitMap64, int]]


def _dead_segments(disk: CrashingDisk) -> tuple[NodeStorage, BitMap64, int]:
    storage = fill(disk, LIMITS, 96)
    live = BitMap64([3, 70])
    checkpoint(storage, 96, live)  # promotion and phase 1 run inside the compaction
    return storage, live, 96


def _dead_tails(disk: CrashingDisk) -> tuple[NodeStorage, BitMap64, int]:
    storage = fill(disk, LIMITS, 96)
    live = BitMap64([1, 2, 17, 40, 41, 50, 66, 90])
    checkpoint(storage, 96, live)
    storage.compact(UID, 1)
    return storage, live, 96


def _sparse(disk: CrashingDisk) -> tuple[NodeStorage, BitMap64, int]:
    storage = fill(disk, LIMITS, 128)
    live = BitMap64(range(5, 129, 7))
    checkpoint(storage, 112, live & BitMap64(range(1, 113)))
    storage.compact(UID, 1)
    return storage, live & BitMap64(range(1, 113)), 112


def _footprint(storage: NodeStorage, phase: Phase) -> tuple[int, ...]:
    """What compaction leaves; after phases 1 and 2 also the exact bytes (loose bytes of
    a cut interrupted between its header and its truncation are trimmed again)."""
    dead, live = dead_and_live(storage)
    size = sum(i.bytes for i, _ in storage.log(UID).segment_infos())
    return (dead, live, size) if phase in (1, 2) else (dead, live)


CASES: list[tuple[str, Setup, Phase]] = [
    ("phase 1", _dead_segments, 1),
    ("phase 2", _dead_tails, 2),
    ("phase 3", _sparse, 3),
    ("auto", _sparse, "auto"),
]


@pytest.mark.parametrize(("name", "setup", "phase"), CASES, ids=[c[0] for c in CASES])
def test_crash_at_every_disk_operation(name: str, setup: Setup, phase: Phase) -> None:
    disk = CrashingDisk()
    storage, live, snap = setup(disk)
    start = disk.ops
    storage.compact(UID, phase)
    total = disk.ops - start
    assert total > 3, f"{name}: the phase did no work"
    final = _footprint(storage, phase)
    for k in range(1, total + 1):
        for tear in (False, True):
            disk = CrashingDisk()
            storage, live, snap = setup(disk)
            old_snap = storage.log(UID).snapshot_index()
            disk.crash_at = disk.ops + k
            with pytest.raises(Crash):
                storage.compact(UID, phase)
            disk.crash(random.Random(k) if tear else None)
            recovered = reopen(disk, LIMITS)
            if recovered.log(UID).snapshot_index() == old_snap != snap:
                # the promotion was not durable yet: nothing was deleted
                assert_intact(recovered, BitMap64(), old_snap)
            else:
                assert_intact(recovered, live, snap)
            # compacting again from wherever the crash left it reaches the same end
            recovered.compact(UID, phase)
            assert _footprint(recovered, phase) == final, (name, k)
            assert_intact(recovered, live, snap)
            assert_intact(reopen(disk, LIMITS), live, snap)
