"""The simulator with every server's storage on the real code over a fake disk: seeded
runs with crashes, torn writes, partitions and membership changes keep the simulator's
Raft safety and linearizability checkers green (no confirmed write is lost)."""

from __future__ import annotations

import dataclasses
import random

import pytest

from engine.errors import RecoveryRefused
from engine.ids import ServerId
from engine.raft.server import Fault
from engine.sim.disk_storage import SimDiskStorage
from engine.sim.run import run_seed
from engine.sim.storage import SimStorage
from engine.sim.world import SimConfig, World
from tests.engine.storage.conftest import small_limits

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


def _damage_wal_at(world: World, stores: dict[str, SimDiskStorage], sid: str, at_ms: int) -> None:
    """At ``at_ms``: crash ``sid``, flip a bit a third into its WAL file (synced data
    with valid batches after it), recover again and restart the server."""

    def damage() -> None:
        store = stores[sid]
        world.crash(ServerId(sid))
        wal = "wal/" + store.disk.listdir("wal")[-2]  # the file before the one just opened
        size = len(store.disk.read(wal))
        assert size > 2000
        store.disk.flip_bit(wal, 8 * (size // 3))
        store.crash(random.Random(0), tear=False)
        assert store.repairing() and "corrupt at byte" in str(store.recovered.repair_reason)
        world.restart(ServerId(sid))

    world.schedule(at_ms, damage)


def test_a_replica_whose_durable_wal_is_corrupt_restarts_in_repair_and_is_repaired() -> None:
    stores: dict[str, SimDiskStorage] = {}

    def factory(sid: ServerId) -> SimStorage:
        stores[sid] = SimDiskStorage(limits=dataclasses.replace(LIMITS, wal_file_bytes_max=1 << 20))
        return stores[sid]

    config = SimConfig(seed=5, steps=3000, crashes=False, corrupt_disks=True, membership=False)
    world = World(config, storage_factory=factory, keep_trace=True)
    _damage_wal_at(world, stores, "s1", 2000)
    assert world.run() == []
    assert world.full_trace is not None
    assert any("restart s1" in line and "repairing" in line for line in world.full_trace)
    assert any(
        line.endswith("s1 repaired term=" + line.split("term=")[-1]) for line in world.full_trace
    )
    assert not world.nodes[ServerId("s1")].raft.repairing
    assert not stores["s1"].repairing(), "the marker is gone"


def test_a_single_member_whose_durable_wal_is_corrupt_refuses_to_start() -> None:
    stores: dict[str, SimDiskStorage] = {}

    def factory(sid: ServerId) -> SimStorage:
        stores[sid] = SimDiskStorage(limits=dataclasses.replace(LIMITS, wal_file_bytes_max=1 << 20))
        return stores[sid]

    world = World(SimConfig(seed=5, servers=1, steps=3000, crashes=False), storage_factory=factory)
    _damage_wal_at(world, stores, "s1", 2000)
    with pytest.raises(RecoveryRefused, match="no other member to repair it from"):
        world.run()


DAMAGE_SEEDS = 200


def _damaged_world(seed: int, servers: int = 3, fault: Fault = Fault.NONE) -> World:
    def factory(_sid: ServerId) -> SimStorage:
        return SimDiskStorage(limits=LIMITS)

    config = SimConfig(seed=seed, servers=servers, corrupt_disks=True, fault=fault)
    return World(config, storage_factory=factory, keep_trace=True)


def test_seeds_with_damaged_disks_stay_safe_and_every_damaged_replica_is_repaired() -> None:
    """Bits flipped in the WAL, segment data, segment index or header and checkpoints of
    one replica at a time, then a restart: Raft safety and linearizability hold, and at
    the end every member has left repair and applied the leader's state (the world's
    settling checks it)."""
    failed = []
    kinds: dict[str, int] = {}
    repaired = 0
    for seed in range(DAMAGE_SEEDS):
        world = _damaged_world(seed)
        violations = world.run()
        if violations:
            failed.append((seed, violations[:2], list(world.trace)[-8:]))
        for hits in world.nemesis.damaged.values():
            for hit in hits:
                words = hit.split()
                kind = " ".join(words[:2]) if words[0] == "segment" else words[0]
                kinds[kind] = kinds.get(kind, 0) + 1
        assert world.full_trace is not None
        repaired += sum(" repaired term=" in line for line in world.full_trace)
    assert not failed, failed[:1]
    assert sorted(kinds) == ["checkpoint", "segment data", "segment index", "wal"], kinds
    assert sum(kinds.values()) >= DAMAGE_SEEDS // 4 and repaired >= DAMAGE_SEEDS // 5


def test_seeds_with_damaged_disks_and_five_servers() -> None:
    failed = [s for s in range(1000, 1020) if _damaged_world(s, servers=5).run()]
    assert not failed, f"seeds {failed}"


def test_without_repair_mode_the_damage_seeds_find_a_violation() -> None:
    """The checkers see what repair mode prevents: a replica that lost durable data and
    runs as a normal member breaks Raft's safety in some seed of the budget."""
    for seed in range(DAMAGE_SEEDS):
        violations = _damaged_world(seed, fault=Fault.REPAIR_OFF).run()
        if violations:
            words = ("state machine safety", "leader completeness", "linearizability", "lost")
            assert any(w in v for v in violations for w in words), violations
            return
    pytest.fail(f"REPAIR_OFF went unnoticed in {DAMAGE_SEEDS} seeds")
