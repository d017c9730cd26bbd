"""The password workers: argon2 off the event loop, a bounded number waiting, a bounded
wait, and refusals at once beyond that."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import anyio
import pytest
from argon2 import PasswordHasher
from sqlalchemy.orm import Session

from app.api.deps import check_login
from app.auth import hash_password, needs_rehash
from app.db import repo
from app.db.migrate import upgrade_to_head
from app.db.session import Database
from app.passwords import LoginsBusy, PasswordWorkers
from app.settings import PROJECT_ROOT
from app.throttle import FailureThrottle


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


def test_a_hash_with_old_parameters_is_redone_at_the_next_login(tmp_path: Path) -> None:
    """argon2-cffi's default parameters (64 MiB, 3 passes, 4 lanes) cost a flood of logins
    seven times the CPU of today's; a user's old hash still verifies, and their next
    successful login stores it anew with today's parameters."""
    old_hash = PasswordHasher().hash("a-password")
    assert needs_rehash(old_hash) and not needs_rehash(hash_password("a-password"))
    db = Database(f"sqlite:///{tmp_path / 'meta.sqlite3'}")
    upgrade_to_head(db.engine, PROJECT_ROOT / "migrations")
    with db.transaction() as session:
        repo.create_user(
            session,
            name="old",
            password_hash=old_hash,
            role="user",
            configure="",
            write="",
            read="",
        )
    state = SimpleNamespace(
        db=db,
        login_throttle=FailureThrottle(),
        passwords=PasswordWorkers(workers=1, waiting_max=1, wait_ms_max=1000),
    )
    try:
        assert anyio.run(check_login, state, "old", "wrong", "127.0.0.1") is None
        with db.transaction() as session:
            assert _stored_hash(session, "old") == old_hash  # a wrong password changes nothing
        principal = anyio.run(check_login, state, "old", "a-password", "127.0.0.1")
        assert principal is not None and principal.name == "old"
        with db.transaction() as session:
            new_hash = _stored_hash(session, "old")
        assert new_hash != old_hash and not needs_rehash(new_hash)
        assert anyio.run(check_login, state, "old", "a-password", "127.0.0.1") is not None
    finally:
        state.passwords.close()
        db.dispose()


def _stored_hash(session: Session, name: str) -> str:
    user = repo.get_user(session, name)
    assert user is not None
    return user.password_hash
