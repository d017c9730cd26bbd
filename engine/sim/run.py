"""Run one seed and say what happened: the unit of ``quorra sim`` and of the CI tests."""

from __future__ import annotations

import time
from dataclasses import dataclass

from engine.ids import ServerId
from engine.raft.server import Fault
from engine.sim.disk_storage import SMALL_FILES, SimDiskStorage
from engine.sim.storage import SimStorage
from engine.sim.world import SimConfig, StorageFactory, WorkloadFactory, World


@dataclass(frozen=True, slots=True)
class SeedResult:
    seed: int
    violations: tuple[str, ...]
    trace: tuple[str, ...]
    """The last lines of the run's trace."""
    digest: str
    steps: int
    sim_ms: int
    ops_completed: int
    wall_s: float

    @property
    def passed(self) -> bool:
        return not self.violations

    @classmethod
    def of(
        cls, seed: int, world: World, violations: list[str], ops_completed: int, started: float
    ) -> SeedResult:
        """What ``world`` did once it ran (``started``: ``perf_counter`` before it was
        built); a violation that several steps found is listed once."""
        return cls(
            seed=seed,
            violations=tuple(dict.fromkeys(violations)),
            trace=tuple(world.trace),
            digest=world.trace_digest(),
            steps=world.steps,
            sim_ms=world.now_ms,
            ops_completed=ops_completed,
            wall_s=time.perf_counter() - started,
        )


def run_seed(
    seed: int,
    steps: int = 3000,
    servers: int = 3,
    fault: Fault = Fault.NONE,
    workload_factory: WorkloadFactory | None = None,
    storage_factory: StorageFactory | None = None,
    corrupt_disks: bool = False,
) -> SeedResult:
    """With ``corrupt_disks`` (and no ``storage_factory``), every server runs the real
    storage on a fake disk whose files get damaged (see ``engine.sim.faults``)."""
    started = time.perf_counter()
    if corrupt_disks and storage_factory is None:
        storage_factory = _disk_storage
    world = World(
        SimConfig(
            seed=seed, servers=servers, steps=steps, fault=fault, corrupt_disks=corrupt_disks
        ),
        workload_factory=workload_factory,
        storage_factory=storage_factory,
    )
    violations = world.run()
    completed = getattr(world.workload, "completed", 0)
    return SeedResult.of(seed, world, violations, int(completed), started)


def _disk_storage(_sid: ServerId) -> SimStorage:
    return SimDiskStorage(limits=SMALL_FILES)


__all__ = ["SeedResult", "run_seed"]
