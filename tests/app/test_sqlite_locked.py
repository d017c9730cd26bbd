"""An administrative write that SQLite refuses as locked (its busy timeout waited out
behind other writers) runs again in a new transaction instead of failing the request
(``app.queue_admin._in_transaction``); other errors are not retried."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from sqlalchemy import select
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

import app.db.session as db_session
from app import queue_admin
from app.db.migrate import upgrade_to_head
from app.db.models import AuditEntry
from app.db.session import Database
from app.settings import PROJECT_ROOT


@pytest.fixture()
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Database]:
    monkeypatch.setattr(db_session, "SQLITE_BUSY_TIMEOUT_MS", 20)
    database = Database(f"sqlite:///{tmp_path / 'meta.sqlite3'}")
    upgrade_to_head(database.engine, PROJECT_ROOT / "migrations")
    yield database
    database.dispose()


def test_a_locked_write_runs_again_and_is_written_once(db: Database, tmp_path: Path) -> None:
    holder = sqlite3.connect(
        tmp_path / "meta.sqlite3", isolation_level=None, check_same_thread=False
    )
    holder.execute("BEGIN IMMEDIATE")  # another writer holds the lock
    attempts = []

    def work(session: Session) -> None:
        attempts.append(len(attempts) + 1)
        if len(attempts) == 2:
            holder.execute("ROLLBACK")  # the other writer is done by the second attempt
        queue_admin._audit(session, queue_admin.Actor("admin"), "queue.create", "q1")

    anyio.run(queue_admin._in_transaction, db, work)
    holder.close()
    assert attempts == [1, 2]
    with db.transaction() as session:
        rows = session.scalars(select(AuditEntry)).all()
    assert [(r.action, r.target) for r in rows] == [("queue.create", "q1")]


def test_a_lock_held_through_every_attempt_fails(db: Database, tmp_path: Path) -> None:
    holder = sqlite3.connect(
        tmp_path / "meta.sqlite3", isolation_level=None, check_same_thread=False
    )
    holder.execute("BEGIN IMMEDIATE")
    attempts = []

    def work(session: Session) -> None:
        attempts.append(1)
        queue_admin._audit(session, queue_admin.Actor("admin"), "queue.create", "q1")

    with pytest.raises(OperationalError, match="database is locked"):
        anyio.run(queue_admin._in_transaction, db, work)
    holder.close()
    assert len(attempts) == queue_admin.SQLITE_LOCKED_ATTEMPTS_MAX


def test_other_errors_are_not_retried(db: Database) -> None:
    attempts = []

    def work(session: Session) -> None:
        attempts.append(1)
        raise ValueError("not a lock")

    with pytest.raises(ValueError, match="not a lock"):
        anyio.run(queue_admin._in_transaction, db, work)
    assert attempts == [1]
