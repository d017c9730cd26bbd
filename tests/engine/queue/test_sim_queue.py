"""Seeded simulation of a 3-server cluster running the queue machine, with crashes,
torn writes, partitions, membership changes and leadership transfers.

A failing seed is printed with the end of its trace; re-run it alone with
``python -m engine.sim.queue_workload --seeds 1 --first-seed SEED`` (add
``--page-budget 1`` for the paged runs).
"""

from __future__ import annotations

import pytest

from engine.sim.queue_workload import run_queue_seed

SEEDS = range(0, 24)


@pytest.mark.parametrize("seed", SEEDS)
def test_queue_safety_under_faults(seed: int) -> None:
    result = run_queue_seed(seed, steps=4000)
    trace = "\n".join(result.trace[-12:])
    assert result.passed, f"seed {seed}: {result.violations}\n{trace}"
    assert result.ops_completed > 0, f"seed {seed}: no operation completed"


@pytest.mark.parametrize(("seed", "pages"), [(100, 1), (101, 1), (102, 1), (103, 4), (104, 4)])
def test_queue_safety_with_a_few_pages_in_memory(seed: int, pages: int) -> None:
    """Every replica pages its ready index with a budget of one or four pages
    (``page_budget``), the queue kept deep (more publishers than consumers): replicas
    agree byte for byte and nothing is lost, through crashes and restores."""
    result = run_queue_seed(seed, steps=3000, page_budget=pages, publishers=3, consumers=1)
    trace = "\n".join(result.trace[-12:])
    assert result.passed, f"seed {seed}: {result.violations}\n{trace}"
    assert result.ops_completed > 0


def test_a_seed_replays_exactly() -> None:
    first, again = run_queue_seed(7, steps=1500), run_queue_seed(7, steps=1500)
    assert first.digest == again.digest and first.ops_completed == again.ops_completed
