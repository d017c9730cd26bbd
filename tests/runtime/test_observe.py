"""The live set behind stats is reused for longer when it is costly to build, so that a
deep queue's stats do not keep the event loop busy."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from pyroaring import BitMap64

from engine.runtime import observe


class _Machine:
    def __init__(self) -> None:
        self.builds = 0

    def live_indexes(self) -> BitMap64:
        self.builds += 1
        return BitMap64([self.builds])


def _replica(machine: _Machine, applied: int) -> Any:
    return SimpleNamespace(machine=machine, applied_index=applied, live_cache=None)


def test_reused_while_nothing_applied_and_rebuilt_once_stale() -> None:
    m = _Machine()
    rep = _replica(m, 5)
    assert list(observe.live_indexes(rep)) == [1]
    rep.applied_index = 6
    assert list(observe.live_indexes(rep)) == [1]  # fresh enough
    machine, applied, _, live, cost = rep.live_cache
    rep.live_cache = (machine, applied, time.monotonic() - 2 * observe.LIVE_SET_REUSE_S, live, cost)
    assert list(observe.live_indexes(rep)) == [2]


def test_a_costly_live_set_is_reused_for_longer() -> None:
    m = _Machine()
    rep = _replica(m, 5)
    observe.live_indexes(rep)
    rep.applied_index = 9
    cost = 1.0  # as a queue of tens of millions of messages takes
    age = observe.LIVE_SET_COST_FACTOR * cost / 2
    machine, applied, _, live, _ = rep.live_cache
    rep.live_cache = (machine, applied, time.monotonic() - age, live, cost)
    assert list(observe.live_indexes(rep)) == [1]
    rep.live_cache = (machine, applied, time.monotonic() - 2 * age - 1, live, cost)
    assert list(observe.live_indexes(rep)) == [2]


def test_a_new_machine_is_never_answered_from_the_old_one() -> None:
    rep = _replica(_Machine(), 5)
    observe.live_indexes(rep)
    rep.machine = _Machine()  # a snapshot was installed
    assert list(observe.live_indexes(rep)) == [1] and rep.machine.builds == 1
