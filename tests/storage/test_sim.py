"""The simulator with every server's storage on the real code over a fake disk: seeded
runs with crashes, torn writes, partitions and membership changes keep the simulator's
Raft safety and linearizability checkers green (no confirmed write is lost)."""

from __future__ import annotations

import dataclasses

import pytest

from engine.errors import RecoveryRefused
from engine.ids import ServerId
from engine.sim.run import run_seed
from engine.sim.storage import SimStorage
from engine.sim.world import SimConfig, World
from engine.storage import NodeStorage
from engine.storage.simulated import SimDiskStorage
from tests.storage.conftest import small_limits

# Small files, so that WAL rolls, segment flushes and many segments happen in short runs.
LIMITS = small_limits(
    wal_file_bytes_max=4096,
    wal_batch_bytes_max=2048,
    entry_bytes_max=2048,
    segment_entries_max=8,
    segment_file_bytes_max=4096,
)


def test_seeds_pass_with_storage_on_the_fake_disk() -> None:
    made: list[SimDiskStorage] = []

    def factory(_sid: ServerId) -> SimStorage:
        made.append(SimDiskStorage(limits=LIMITS))
        return made[-1]

    failed = []
    for seed in range(30):
        result = run_seed(seed, storage_factory=factory)
        if not result.passed:
            failed.append((seed, result.violations[:2], result.trace[-6:]))
    assert not failed, failed[:1]
    segments = sum(len(s.disk.listdir("queues/server/segments")) for s in made)
    snapshots = sum(len(s.disk.listdir("queues/server/snapshots")) for s in made)
    assert segments > 0 and snapshots > 0, "runs reached segments and snapshots"


def test_a_replica_whose_durable_wal_is_corrupt_refuses_to_start() -> None:
    stores: dict[str, SimDiskStorage] = {}

    def factory(sid: ServerId) -> SimStorage:
        stores[sid] = SimDiskStorage(limits=dataclasses.replace(LIMITS, wal_file_bytes_max=1 << 20))
        return stores[sid]

    world = World(SimConfig(seed=5, steps=800, crashes=False), storage_factory=factory)
    assert world.run() == []
    store = stores[sorted(stores)[0]]
    store.sync()
    wal = "wal/" + store.disk.listdir("wal")[-1]
    size = len(store.disk.read(wal))
    assert size > 2000
    store.disk.flip_bit(wal, 8 * (size // 3))
    store.disk.crash()
    with pytest.raises(RecoveryRefused, match="corrupt at byte"):
        NodeStorage.open(store.disk, store.limits)
