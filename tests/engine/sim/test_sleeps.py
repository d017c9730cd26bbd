"""A lone server that sleeps and wakes as a sleeping queue does (rebuilt from its storage,
leading again in its term without an election: ``SimConfig.sleeps``), and crashes right
after some wakes: every check of the simulator holds (nothing confirmed is lost, terms
never go back, log matching), for the key-value and the queue workloads. A resume after
a crash, which the wake's rule forbids, is caught within the same seeds."""

from __future__ import annotations

from engine.ids import ServerId
from engine.raft.events import Tick
from engine.sim.queue_workload import run_queue_seed
from engine.sim.world import SimConfig, World

SEEDS = 40


def sleeping_world(seed: int, world: type[World] = World) -> World:
    config = SimConfig(seed=seed, servers=1, steps=6000, crashes=False, sleeps=True)
    return world(config, keep_trace=True)


def test_a_lone_server_that_sleeps_and_wakes_keeps_every_check() -> None:
    failed = []
    wakes = crashes = 0
    for seed in range(SEEDS):
        world = sleeping_world(seed)
        violations = world.run()
        if violations:
            failed.append((seed, violations[:2], list(world.trace)[-8:]))
        trace = world.full_trace or []
        wakes += sum(" wake s1 " in line and "resumed=True" in line for line in trace)
        crashes += sum(" crash s1" in line for line in trace)
    assert not failed, failed[:2]
    assert wakes >= SEEDS and crashes >= SEEDS // 2, (wakes, crashes)


def test_the_queue_workload_keeps_every_message_across_wakes() -> None:
    failed = []
    ops = 0
    for seed in range(20):
        result = run_queue_seed(seed, steps=6000, sleeps=True)
        ops += result.ops_completed
        if not result.passed:
            failed.append((seed, result.violations[:2], result.trace[-8:]))
    assert not failed, failed[:2]
    assert ops > 100 * 20, "the clients got work done"


class _ResumesAfterACrash(World):
    """Wrong on purpose: a restart after a crash resumes its leadership as a wake does,
    though what it appended in its term may be lost."""

    def restart(self, sid: ServerId) -> None:
        super().restart(sid)
        node = self.nodes[sid]
        if node.raft.resume_as_sole_leader():
            self.step(node, Tick(self.now_ms))


def test_resuming_after_a_crash_is_caught() -> None:
    for seed in range(SEEDS):
        violations = sleeping_world(seed, _ResumesAfterACrash).run()
        if violations:
            assert any("log matching" in v for v in violations), violations
            return
    raise AssertionError(f"a resume after a crash went unnoticed in {SEEDS} seeds")
