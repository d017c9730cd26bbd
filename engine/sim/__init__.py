"""engine.sim: the deterministic simulator (see engine/__init__.py for the layering).

``run_seed`` runs one seed; ``World`` is the cluster with its plug points: a
``SimStorage`` per server (``storage_factory``), a ``Workload`` (machine, clients, final
checks) and extra ``Observer`` checkers.
"""

from engine.sim.checkers import Observer, RaftSafety, RegisterOp, check_register
from engine.sim.run import SeedResult, run_seed
from engine.sim.storage import MemStorage, SimStorage
from engine.sim.workload import KvWorkload, Workload
from engine.sim.world import SimConfig, SimNode, World

__all__ = [
    "KvWorkload",
    "MemStorage",
    "Observer",
    "RaftSafety",
    "RegisterOp",
    "SeedResult",
    "SimConfig",
    "SimNode",
    "SimStorage",
    "Workload",
    "World",
    "check_register",
    "run_seed",
]
