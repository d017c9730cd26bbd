"""The memory alarm's sum over the node's queues is spaced by what it costs."""

from __future__ import annotations

import itertools
from types import SimpleNamespace
from typing import Any, cast

from engine.limits import Limits
from engine.runtime.memory_alarm import MemoryWatch


class Clock:
    def __init__(self) -> None:
        self.now_ms = 0

    def monotonic_ms(self) -> int:
        return self.now_ms


def _node(queues: int, ms_per_queue: int) -> tuple[MemoryWatch, Clock, list[int]]:
    """A node of ``queues`` whose memory estimate takes ``ms_per_queue`` each; the list
    counts the sums."""
    clock = Clock()
    sums = [0]

    def memory_use() -> Any:
        clock.now_ms += ms_per_queue
        return SimpleNamespace(total_bytes=100)

    machine = SimpleNamespace(memory_use=memory_use)
    replicas = {
        f"q{n}": SimpleNamespace(
            closed=False, machine=machine, inflight_publish_bytes=0, dormant=None
        )
        for n in range(queues)
    }
    ctx = SimpleNamespace(
        replicas=replicas, limits=Limits(), clock=clock, name="n1", has_storage=False, writer=None
    )
    watch = MemoryWatch(cast(Any, ctx))
    summed = watch.sum_engine_bytes

    def counting() -> int:
        sums[0] += 1
        return summed()

    watch.sum_engine_bytes = counting  # type: ignore[method-assign]
    return watch, clock, sums


def test_a_cheap_sum_is_taken_again_each_interval() -> None:
    watch, clock, sums = _node(10, 0)
    for t in range(0, 1000, 10):
        clock.now_ms = t
        watch.check_publish(1)
    assert sums[0] == 10 and watch.engine_bytes == 1000


def test_a_costly_sum_is_taken_at_most_once_per_twenty_times_its_cost() -> None:
    watch, clock, sums = _node(50, 1)  # 50 ms a sum: at most one per second
    times = []
    for t in range(0, 5000, 10):
        clock.now_ms = max(clock.now_ms, t)
        before = sums[0]
        watch.check_publish(1)
        if sums[0] > before:
            times.append(t)
    assert len(times) == 5, times
    assert all(b - a >= 1000 for a, b in itertools.pairwise(times)), times
