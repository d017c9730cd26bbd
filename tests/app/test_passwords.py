"""The password workers: argon2 off the event loop, a bounded number waiting, a bounded
wait, and refusals at once beyond that."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import anyio
import pytest

from app.auth import hash_password
from app.passwords import LoginsBusy, PasswordWorkers


@pytest.fixture()
def workers() -> Iterator[PasswordWorkers]:
    pool = PasswordWorkers(workers=1, waiting_max=1, wait_ms_max=200)
    try:
        yield pool
    finally:
        pool.close()


def test_checks_and_hashes_run_off_the_event_loop(workers: PasswordWorkers) -> None:
    async def main() -> None:
        loop_thread = threading.get_ident()
        stored = await workers.hash("a-password")
        with workers.slot():
            assert await workers.check(stored, "a-password")
        with workers.slot():
            assert not await workers.check(stored, "another")
        with workers.slot():
            assert not await workers.check(None, "a-password")  # no such user: same cost
        assert threading.get_ident() == loop_thread

    anyio.run(main)


def test_places_beyond_workers_and_waiting_are_refused_at_once(workers: PasswordWorkers) -> None:
    with workers.slot(), workers.slot():
        started = time.monotonic()
        with pytest.raises(LoginsBusy) as caught, workers.slot():
            pass
        assert time.monotonic() - started < 0.01
    assert caught.value.status == 429 and caught.value.retry_after_s == 1
    with workers.slot():  # places come back
        pass


def test_a_check_that_waits_too_long_for_a_worker_is_refused(workers: PasswordWorkers) -> None:
    stored = hash_password("a-password")
    release = threading.Event()

    async def main() -> None:
        async def busy() -> None:  # holds the only worker until released
            with workers.slot():
                await workers._run(release.wait)

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(busy)
            await anyio.sleep(0.05)
            started = time.monotonic()
            with pytest.raises(LoginsBusy), workers.slot():
                await workers.check(stored, "a-password")
            assert 0.15 <= time.monotonic() - started < 1.0  # wait_ms_max, not more
            release.set()
        with workers.slot():  # the worker's turn came back when it finished
            assert await workers.check(stored, "a-password")

    anyio.run(main)


def test_a_cancelled_caller_keeps_the_turn_until_the_worker_is_done(
    workers: PasswordWorkers,
) -> None:
    release = threading.Event()

    async def main() -> None:
        with anyio.move_on_after(0.05), workers.slot():
            await workers._run(release.wait)  # the caller gives up; the worker goes on
        with pytest.raises(LoginsBusy), workers.slot():
            await workers._run(lambda: None)  # no turn while the worker is busy
        release.set()
        await anyio.sleep(0.05)
        with workers.slot():
            await workers._run(lambda: None)

    anyio.run(main)
