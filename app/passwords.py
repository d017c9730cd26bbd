"""Password hashing off the event loop, with a bound on how much may wait for it.

argon2 is slow on purpose (about 25 ms of CPU per check here, app/auth.py), so a server
that checked every login as it came would let anyone queue minutes of work with a few
hundred requests. Checks and hashes run on a thread
pool of their own, ``workers`` at once: they never take the threads that the database
work of other requests runs on (anyio's), nor those theirs. At most ``waiting_max`` more
wait for a worker, each for at most ``wait_ms_max``; a request beyond that is refused
with ``LoginsBusy`` (429 with ``Retry-After``), at once or after that wait, instead of
queueing without bound. The workers run at a lower CPU priority (``WORKER_NICE``, Linux),
as do the threads argon2 starts from them: when the CPU is short, the event loop and the
queues it serves come first and logins wait. (argon2 uses one thread per lane; with
one lane, a check runs on its worker alone.)

A caller takes its place (``slot``) before it reads the user from the database, and
holds no database session across the hash.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TypeVar, TypeVarTuple

import anyio

from app.auth import check_password, hash_password
from app.problems import AppProblem

_T = TypeVar("_T")
_Args = TypeVarTuple("_Args")
BUSY_RETRY_S = 1
"""A full pool drains in about (workers + waiting_max) / workers checks of ~25 ms."""
WORKER_NICE = 10
"""A thread at nice 10 gets about a tenth of the CPU a nice-0 thread (the event loop)
gets when both want it."""


class LoginsBusy(AppProblem):
    status, problem, title = 429, "logins-busy", "Too many logins at once"
    retry_after_s = BUSY_RETRY_S

    def __init__(self) -> None:
        super().__init__(
            f"the server is checking too many passwords at once; retry in {BUSY_RETRY_S} s"
        )


def _lower_priority() -> None:
    if sys.platform == "linux":  # the nice value is per thread there, inherited by new ones
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WORKER_NICE)


class PasswordWorkers:
    """One per app; used from the event loop (a sync endpoint goes through
    ``hash_from_thread``)."""

    def __init__(self, workers: int, waiting_max: int, wait_ms_max: int) -> None:
        assert workers >= 1 and waiting_max >= 0 and wait_ms_max > 0
        self.workers = workers
        self.waiting_max = waiting_max
        self.wait_ms_max = wait_ms_max
        self._turns = anyio.Semaphore(workers)
        self._pool = ThreadPoolExecutor(
            workers, thread_name_prefix="quorra-passwords", initializer=_lower_priority
        )
        self._admitted = 0

    @contextmanager
    def slot(self) -> Iterator[None]:
        """A place among ``workers + waiting_max``, held until the block ends; else
        ``LoginsBusy`` at once."""
        if self._admitted >= self.workers + self.waiting_max:
            raise LoginsBusy
        self._admitted += 1
        try:
            yield
        finally:
            self._admitted -= 1

    async def check(self, password_hash: str | None, password: str) -> bool:
        """``check_password`` on a worker, inside a ``slot``."""
        assert self._admitted > 0, "take a slot first"
        return await self._run(check_password, password_hash, password)

    async def hash(self, password: str) -> str:
        """``hash_password`` on a worker, taking a slot of its own."""
        with self.slot():
            return await self._run(hash_password, password)

    async def rehash(self, password: str) -> str:
        """``hash_password`` on a worker, inside the caller's ``slot``."""
        assert self._admitted > 0, "take a slot first"
        return await self._run(hash_password, password)

    def hash_from_thread(self, password: str) -> str:
        """``hash`` for a sync endpoint (on a worker thread already). Call it before the
        endpoint's first query, so that its session holds no connection meanwhile."""
        return anyio.from_thread.run(self.hash, password)

    def close(self) -> None:
        """Stop the workers (the app's lifespan, at shutdown); waiting work is dropped."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def _run(self, work: Callable[[*_Args], _T], *args: *_Args) -> _T:
        """``work`` on a worker once it is this caller's turn; ``LoginsBusy`` when no
        turn came within ``wait_ms_max`` (under load the count alone bounds the wait
        only in checks, not in time). The turn is given back when the worker is done,
        even if the caller stopped waiting (a cancelled request)."""
        turn = False
        with anyio.move_on_after(self.wait_ms_max / 1000):
            await self._turns.acquire()
            turn = True
        if not turn:
            raise LoginsBusy
        loop = asyncio.get_running_loop()
        try:
            done = self._pool.submit(work, *args)
        except BaseException:
            self._turns.release()
            raise
        done.add_done_callback(lambda _done: _call_soon(loop, self._turns.release))
        return await asyncio.wrap_future(done)


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[[], object]) -> None:
    if not loop.is_closed():  # else the app has stopped, and its turns with it
        loop.call_soon_threadsafe(callback)
