"""``Deadlines``: futures that fail with an error of their own if they have no result
within one fixed delay, under a single timer.

Every proposal of a node waits up to ``proposal_timeout_ms`` for its answer
(``NodeContext.propose``). A timer per proposal (``asyncio.wait_for``, or ``call_later``
and its ``cancel``) was made and dropped on every publish. All of them wait as long, so
their deadlines come in the order they were added: one timer, armed at the oldest
deadline still waited for, serves them all, and the futures already answered leave from
the front as new ones come, so only those in flight (and a few answered behind the
oldest one still waiting) are held.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable


class Deadlines:
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        delay_s: float,
        error: Callable[[str], BaseException],
    ) -> None:
        assert delay_s > 0
        self.loop = loop
        self.delay_s = delay_s
        self.error = error
        """The exception a late future fails with, from the name it was added with."""
        self._waiting: collections.deque[tuple[float, asyncio.Future[object], str]] = (
            collections.deque()
        )
        self._timer: asyncio.TimerHandle | None = None

    def add(self, future: asyncio.Future[object], name: str) -> None:
        """Fail ``future`` with ``error(name)`` unless it is done ``delay_s`` from now."""
        waiting = self._waiting
        while waiting and waiting[0][1].done():
            waiting.popleft()
        loop = self.loop
        waiting.append((loop.time() + self.delay_s, future, name))
        if self._timer is None:
            self._timer = loop.call_at(waiting[0][0], self._late)

    def __len__(self) -> int:
        """How many are held (waiting, or answered behind the oldest one waiting)."""
        return len(self._waiting)

    def close(self) -> None:
        """Stop timing: nothing added so far fails from here on."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._waiting.clear()

    def _late(self) -> None:
        self._timer = None
        waiting = self._waiting
        now = self.loop.time()
        while waiting:
            due, future, name = waiting[0]
            if not future.done():
                if due > now:
                    self._timer = self.loop.call_at(due, self._late)
                    return
                future.set_exception(self.error(name))
            waiting.popleft()


__all__ = ["Deadlines"]
