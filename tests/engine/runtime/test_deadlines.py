"""``Deadlines`` (engine/runtime/deadlines.py): the proposals' timeouts under one timer."""

from __future__ import annotations

import asyncio

import pytest

from engine.runtime.deadlines import Deadlines
from tests.engine.runtime.util import run


class Late(Exception):
    pass


def test_each_future_fails_at_its_own_deadline_unless_answered() -> None:
    async def body() -> None:
        loop = asyncio.get_running_loop()
        deadlines = Deadlines(loop, 0.2, Late)
        started = loop.time()
        first, answered, second = (loop.create_future() for _ in range(3))
        deadlines.add(first, "first")
        deadlines.add(answered, "answered")
        await asyncio.sleep(0.1)
        deadlines.add(second, "second")
        answered.set_result("yes")
        with pytest.raises(Late, match="first"):
            await first
        first_s = loop.time() - started
        assert not second.done()
        with pytest.raises(Late, match="second"):
            await second
        second_s = loop.time() - started
        assert 0.2 <= first_s < second_s and second_s >= 0.3
        assert answered.result() == "yes"
        assert len(deadlines) == 0
        # Timing again after everything fell due: a new timer.
        third = loop.create_future()
        deadlines.add(third, "third")
        with pytest.raises(Late, match="third"):
            await third

    run(body())


def test_answered_futures_are_not_held_once_newer_ones_come() -> None:
    async def body() -> None:
        loop = asyncio.get_running_loop()
        deadlines = Deadlines(loop, 60.0, Late)
        for i in range(1000):
            future = loop.create_future()
            deadlines.add(future, str(i))
            future.set_result(i)
        assert len(deadlines) == 1  # the last one, answered after it was added
        cancelled = loop.create_future()
        deadlines.add(cancelled, "cancelled")
        cancelled.cancel()
        deadlines.close()
        assert len(deadlines) == 0

    run(body())


def test_closed_nothing_fails_any_more() -> None:
    async def body() -> None:
        loop = asyncio.get_running_loop()
        deadlines = Deadlines(loop, 0.05, Late)
        future = loop.create_future()
        deadlines.add(future, "kept")
        deadlines.close()
        await asyncio.sleep(0.15)
        assert not future.done()

    run(body())
