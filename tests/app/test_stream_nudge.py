"""The publishing task's wake-up: a ``set`` wakes the task waiting, and one given while
no task waits is not kept (the task looks at its condition before it waits)."""

from __future__ import annotations

import asyncio

from app.api.stream import Nudge


def test_a_set_wakes_the_waiting_task() -> None:
    async def body() -> None:
        nudge = Nudge()
        waiting = asyncio.ensure_future(nudge.wait())
        await asyncio.sleep(0)
        assert not waiting.done()
        nudge.set()
        await asyncio.wait_for(waiting, 1)

    asyncio.run(body())


def test_a_set_with_no_task_waiting_is_not_kept() -> None:
    async def body() -> None:
        nudge = Nudge()
        nudge.set()
        waiting = asyncio.ensure_future(nudge.wait())
        await asyncio.sleep(0.01)
        assert not waiting.done()
        nudge.set()
        nudge.set()  # a second one finds no task waiting
        await asyncio.wait_for(waiting, 1)

    asyncio.run(body())


def test_a_cancelled_wait_leaves_the_next_one_working() -> None:
    async def body() -> None:
        nudge = Nudge()
        first = asyncio.ensure_future(nudge.wait())
        await asyncio.sleep(0)
        first.cancel()
        await asyncio.sleep(0)
        nudge.set()  # the cancelled waiter is done: nothing to set
        second = asyncio.ensure_future(nudge.wait())
        await asyncio.sleep(0)
        nudge.set()
        await asyncio.wait_for(second, 1)

    asyncio.run(body())
