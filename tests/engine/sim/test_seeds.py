"""Seeded simulation: the CI budget of seeds passes, runs are reproducible, and the
checkers catch a deliberately broken commit rule within that budget."""

from __future__ import annotations

import pytest

from engine.raft.server import Fault
from engine.runtime.driver import ReplicaDriver
from engine.sim.cli import main
from engine.sim.run import run_seed
from engine.sim.world import SimConfig, World

CI_SEEDS = 200


def test_ci_seeds_pass_with_three_servers() -> None:
    failed = []
    ops = 0
    for seed in range(CI_SEEDS):
        result = run_seed(seed)
        ops += result.ops_completed
        if not result.passed:
            failed.append((seed, result.violations, result.trace[-8:]))
    assert not failed, failed[:2]
    assert ops > 20 * CI_SEEDS, "the clients got work done"


def test_ci_seeds_pass_with_five_servers() -> None:
    failed = [s for s in range(1000, 1040) if not run_seed(s, servers=5).passed]
    assert not failed, f"seeds {failed}"


def test_the_same_seed_gives_the_same_run_byte_for_byte() -> None:
    runs = []
    for _ in range(2):
        world = World(SimConfig(seed=7), keep_trace=True)
        world.run()
        assert world.full_trace is not None
        runs.append(("\n".join(world.full_trace), world.trace_digest(), world.steps))
    assert runs[0] == runs[1]
    other = World(SimConfig(seed=8))
    other.run()
    assert other.trace_digest() != runs[0][1]


@pytest.mark.parametrize("fault", [Fault.COMMIT_QUORUM_OFF_BY_ONE])
def test_a_broken_commit_rule_is_caught_within_the_ci_budget(fault: Fault) -> None:
    for seed in range(CI_SEEDS):
        result = run_seed(seed, fault=fault)
        if not result.passed:
            assert any(
                word in v
                for v in result.violations
                for word in ("leader completeness", "state machine safety", "linearizability")
            ), result.violations
            return
    pytest.fail(f"{fault.name} went unnoticed in {CI_SEEDS} seeds")


def test_the_cli_prints_failures_and_a_summary(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--seeds", "2", "--steps", "500"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("2 passed, 0 failed")
    argv = ["--seeds", "3", "--first-seed", "3", "--fault", "commit_quorum_off_by_one"]
    assert main(argv) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("seed 4 FAILED") and out[1].startswith("    t=")
    assert out[-1].startswith("1 passed, 2 failed")


def test_the_cli_runs_seeds_with_damaged_disks(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--seeds", "3", "--damage"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("3 passed, 0 failed")


def test_a_broken_durability_order_in_the_driver_is_caught_within_the_ci_budget() -> None:
    """The simulator runs the server's replica driver (engine/runtime/driver.py): a driver
    that sends votes and acknowledgements before their writes are durable is caught."""
    for seed in range(CI_SEEDS):
        result = run_seed(seed, fault=Fault.SEND_BEFORE_DURABLE)
        if not result.passed:
            assert any("durable" in v for v in result.violations), result.violations
            return
    pytest.fail(f"SEND_BEFORE_DURABLE went unnoticed in {CI_SEEDS} seeds")


def test_has_ready_misses_nothing_ready_would_hand_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver asks ``has_ready`` before building a ``Ready``: once it says no, a
    ``ready()`` is empty, at every point of many seeds (with damaged disks too)."""
    process = ReplicaDriver.process
    checks = 0

    def checked(self: ReplicaDriver) -> None:
        nonlocal checks
        process(self)
        assert self.raft.ready().is_empty()
        checks += 1

    monkeypatch.setattr(ReplicaDriver, "process", checked)
    for seed in range(30):
        assert run_seed(seed).passed
        assert run_seed(seed, corrupt_disks=True).passed
    assert checks > 10_000
