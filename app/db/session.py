"""The database handle: one SQLAlchemy engine and session factory per app.

A request owns its transaction: ``get_session`` (app/api/deps.py) opens one session
per request, commits when the endpoint returns and rolls back when it raises. Work
outside a request (start-up, background recording by the engine) uses
``Database.transaction()``, which does the same around a ``with`` block. An ``async``
endpoint never queries on the event loop (a query may wait for a pooled connection or
for SQLite's busy timeout, and the whole server would wait with it): it awaits
``Database.run(work)``, a transaction of its own on a worker thread.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import anyio
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import ConnectionPoolEntry

SQLITE_BUSY_TIMEOUT_MS = 5000
_T = TypeVar("_T")


def _on_connect(dbapi_connection: DBAPIConnection, _record: ConnectionPoolEntry) -> None:
    # WAL lets the CLI read and write while the server runs; FULL sync because
    # metadata writes are rare and a lost queue definition is worse than a slow one.
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=FULL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cursor.close()


def create_db_engine(url: str) -> Engine:
    engine = create_engine(url)
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _on_connect)
    return engine


class Database:
    def __init__(self, url: str) -> None:
        self.engine = create_db_engine(url)
        self.session_factory = sessionmaker(self.engine, expire_on_commit=False)

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """A session in one transaction: committed on exit, rolled back on error."""
        with self.session_factory.begin() as session:
            yield session

    async def run(self, work: Callable[[Session], _T]) -> _T:
        """``work(session)`` in a transaction of its own on a worker thread."""

        def run() -> _T:
            with self.transaction() as session:
                return work(session)

        return await anyio.to_thread.run_sync(run)

    def dispose(self) -> None:
        self.engine.dispose()
