"""The plug points others use: a storage factory, a workload, extra observers; and the
simulated disk's crash semantics."""

from __future__ import annotations

import random

from engine.ids import ServerId
from engine.raft.entry import Entry, EntryKind
from engine.raft.events import HardState
from engine.raft.kv import KvMachine
from engine.raft.state_machine import ApplyMeta, CheckpointRequest, Machine, MachineEffect
from engine.sim.checkers import Observer
from engine.sim.storage import MemStorage, SimStorage
from engine.sim.workload import KvWorkload
from engine.sim.world import SimConfig, SimNode, World


def _e(index: int, term: int = 1) -> Entry:
    return Entry(index, term, EntryKind.COMMAND, 0, b"%d" % index)


def test_a_crash_keeps_synced_writes_and_loses_the_rest() -> None:
    s = MemStorage()
    s.write(HardState(1, ServerId("a"), 0), None, [_e(1), _e(2)])
    s.sync()
    s.write(HardState(2, None, 0), None, [_e(3)])
    assert s.last_index() == 3, "a write is visible at once"
    s.crash(random.Random(0), tear=False)
    assert s.last_index() == 2 and s.recover() == (HardState(1, ServerId("a"), 0), None)


def test_a_torn_write_keeps_a_prefix_of_its_entries_but_not_its_hard_state() -> None:
    kept = set()
    for seed in range(20):
        s = MemStorage()
        s.write(None, None, [_e(1)])
        s.sync()
        s.write(HardState(3, None, 0), None, [_e(2), _e(3), _e(4)])
        s.crash(random.Random(seed), tear=True)
        assert s.recover()[0] is None
        kept.add(s.last_index())
    assert kept <= {2, 3, 4} and len(kept) > 1


class _CountingStorage(MemStorage):
    writes = 0

    def write(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        _CountingStorage.writes += 1
        super().write(*args, **kwargs)


class _CountApplies(Observer):
    def __init__(self) -> None:
        self.applied = 0

    def on_applied(self, world: World, node: SimNode, entry: Entry, reply: object) -> None:
        self.applied += 1


def test_storage_workload_and_observers_plug_in() -> None:
    def storage(_sid: ServerId) -> SimStorage:
        return _CountingStorage()

    counter = _CountApplies()
    world = World(
        SimConfig(seed=3, steps=1500),
        workload_factory=lambda rng: KvWorkload(rng, clients=2, keys=1),
        storage_factory=storage,
        observers=[counter],
    )
    assert world.run() == []
    assert _CountingStorage.writes > 0 and counter.applied > 0


class _CheckpointingKv(KvMachine):
    """A KV machine that asks for a checkpoint every fourth command, as a queue would."""

    def apply(self, meta: ApplyMeta, command: bytes) -> tuple[object, list[MachineEffect]]:
        reply, effects = super().apply(meta, command)
        if meta.index % 4 == 0:
            effects = [*effects, CheckpointRequest(meta.index)]
        return reply, effects


class _CheckpointWorkload(KvWorkload):
    def make_machine(self) -> Machine:
        return _CheckpointingKv()


def test_a_machine_checkpoint_request_becomes_a_snapshot_at_that_index() -> None:
    world = World(SimConfig(seed=11, steps=1500), workload_factory=_CheckpointWorkload)
    assert world.run() == []
    indexes = [n.snapshot_index for n in world.nodes.values()]
    assert any(i > 0 for i in indexes)
