"""Seeded simulation of the cluster metadata: clients creating and deleting the same names
through different servers, and every node's reconcile loop, under crashes, partitions
and membership changes (see ``engine.sim.meta_workload`` for what is checked).

A failing seed is printed with the end of its trace; re-run it alone with
``quorra sim --workload meta --seeds 1 --first-seed SEED``.
"""

from __future__ import annotations

from typing import Any

import pytest

from engine.cluster import meta_commands as mc
from engine.cluster import meta_machine
from engine.cluster.queue_changes import on_create_queue
from engine.sim.cli import main
from engine.sim.meta_workload import run_meta_seed

SEEDS = 30


def test_metadata_seeds_pass_and_do_work() -> None:
    failed, completed = [], 0
    for seed in range(SEEDS):
        result = run_meta_seed(seed)
        completed += result.ops_completed
        if not result.passed:
            failed.append((seed, result.violations[:3], result.trace[-10:]))
    assert not failed, failed
    assert completed > 20 * SEEDS, "clients got answers"


def test_a_metadata_seed_replays_exactly() -> None:
    first, again = run_meta_seed(5, steps=1500), run_meta_seed(5, steps=1500)
    assert first.digest == again.digest and first.ops_completed == again.ops_completed


def test_a_create_that_replaces_a_live_queue_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checkers have teeth: a machine that lets a create take the name of a queue
    that is not a tombstone fails most seeds."""

    def careless(m: Any, meta: Any, cmd: mc.CreateQueue, touched: Any) -> object:
        old = m.queues.pop(cmd.name, None)
        if old is not None:
            del m.uids[old.uid]
            m.tombstones.pop(old.name, None)
        return on_create_queue(m, meta, cmd, touched)

    monkeypatch.setitem(meta_machine._HANDLERS, mc.CreateQueue, careless)
    caught = [seed for seed in range(10) if not run_meta_seed(seed).passed]
    assert len(caught) >= 5, caught


def test_the_cli_runs_the_metadata_workload(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--workload", "meta", "--seeds", "2", "--steps", "800"]) == 0
    assert capsys.readouterr().out.startswith("2 passed, 0 failed")
    with pytest.raises(SystemExit):
        main(["--workload", "meta", "--damage"])
