"""The nemesis: it injects only the faults the configuration allows, damages one
server's disk per run, and injects nothing once the settling at the end has begun."""

from __future__ import annotations

import re

from engine.ids import ServerId
from engine.sim.disk_storage import SMALL_FILES, SimDiskStorage
from engine.sim.storage import SimStorage
from engine.sim.world import SimConfig, World

# What the nemesis writes in the trace, fault by fault.
FAULTS = {
    "crash": re.compile(r"^t=\d+ crash s\d"),
    "partition": re.compile(r"^t=\d+ partition "),
    "membership": re.compile(r"^t=\d+ s\d asked to (AddServer|RemoveServer|DemoteServer) "),
    "transfer": re.compile(r"^t=\d+ s\d asked to transfer leadership "),
    "damage": re.compile(r"^t=\d+ damage s\d: "),
    "rot": re.compile(r"^t=\d+ damage s\d: .* \(while running\)$"),
}


def _faults_in(lines: list[str]) -> set[str]:
    return {name for name, pattern in FAULTS.items() for line in lines if pattern.match(line)}


def _disk_storage(_sid: ServerId) -> SimStorage:
    return SimDiskStorage(limits=SMALL_FILES)


def _run(config: SimConfig) -> World:
    storage = _disk_storage if config.corrupt_disks else None
    world = World(config, storage_factory=storage, keep_trace=True)
    assert world.run() == []
    assert world.full_trace is not None
    return world


def test_faults_switched_off_are_never_injected() -> None:
    for seed in range(5):
        config = SimConfig(
            seed=seed, crashes=False, partitions=False, membership=False, transfers=False
        )
        world = _run(config)
        assert world.full_trace is not None
        assert _faults_in(world.full_trace) == set(), seed


def test_damage_hits_one_server_per_run_and_every_fault_stops_when_settling() -> None:
    seen: set[str] = set()
    for seed in range(12):
        world = _run(SimConfig(seed=seed, corrupt_disks=True))
        trace = world.full_trace
        assert trace is not None
        damage = [line for line in trace if FAULTS["damage"].match(line)]
        assert len(world.nemesis.damaged) <= 1, (seed, world.nemesis.damaged)
        assert len(damage) == sum(len(hits) for hits in world.nemesis.damaged.values())
        settling = trace.index(next(line for line in trace if line.endswith(" settle")))
        after = _faults_in(trace[settling:]) - {"crash"}  # a read of damaged data crashes
        assert after == set(), (seed, after)
        seen |= _faults_in(trace)
    assert seen == set(FAULTS), seen
