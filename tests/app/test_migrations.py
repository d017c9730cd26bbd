"""A new database built from the models and stamped at the head (app/db/migrate.py) has
exactly the schema that running every migration gives, so that either way to the head
leaves the same database."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from alembic.config import Config
from sqlalchemy import text

from app.db.migrate import alembic_config, stored_revisions, upgrade_to_head
from app.db.session import Database
from app.settings import PROJECT_ROOT

MIGRATIONS = PROJECT_ROOT / "migrations"


def _schema(db: Database) -> list[tuple[str, str, str, str]]:
    """Every table and index as SQLite keeps it, spacing, quoting and the order of table
    constraints aside (a table that a migration rebuilt, as SQLite must to change a
    column, is renamed into place, and SQLite then quotes its name)."""
    with db.engine.connect() as connection:
        rows = connection.execute(text("SELECT type, name, tbl_name, sql FROM sqlite_master"))
        return sorted(
            (row[0], row[1], row[2], re.sub(r"\s*([(),])\s*", r"\1", _unquoted(row[3])).strip())
            for row in rows
        )


def _unquoted(sql: str | None) -> str:
    return _constraints_sorted((sql or "").replace('"', ""))


def _constraints_sorted(sql: str) -> str:
    """A CREATE TABLE's table constraints in one order: a table a migration rebuilt lists
    them in the order the rebuild walked them, which need not be the models'."""
    start = sql.find("(")
    if not sql.startswith("CREATE TABLE") or start < 0 or not sql.endswith(")"):
        return sql
    items, depth, current = [], 0, ""
    for char in sql[start + 1 : -1]:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            items.append(current.strip())
            current = ""
        else:
            current += char
    items.append(current.strip())
    columns = [i for i in items if not i.startswith("CONSTRAINT")]
    constraints = sorted(i for i in items if i.startswith("CONSTRAINT"))
    return sql[: start + 1] + ",".join(columns + constraints) + ")"


def _by_alembic(path: Path) -> Database:
    from alembic import command

    db = Database(f"sqlite:///{path}")
    config = alembic_config(MIGRATIONS, db.engine)
    with db.engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "head")
    return db


def test_a_new_database_from_the_models_equals_one_migrated(tmp_path: Path) -> None:
    fresh, migrated = Database(f"sqlite:///{tmp_path / 'fresh.db'}"), _by_alembic(tmp_path / "m.db")
    try:
        head = upgrade_to_head(fresh.engine, MIGRATIONS)
        assert stored_revisions(fresh.engine) == [head] == stored_revisions(migrated.engine)
        assert _schema(fresh) == _schema(migrated)
        assert len(_schema(fresh)) > 10  # the tables and indexes, not an empty pair
    finally:
        fresh.dispose()
        migrated.dispose()


def _alembic_upgrades(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The targets of every ``alembic.command.upgrade`` from now on (which still runs)."""
    from alembic import command

    calls: list[str] = []
    upgrade = command.upgrade

    def spy(config: Config, revision: str, *args: Any, **kwargs: Any) -> None:
        calls.append(revision)
        upgrade(config, revision, *args, **kwargs)

    monkeypatch.setattr(command, "upgrade", spy)
    return calls


def test_a_new_database_is_made_without_alembic(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Importing Alembic and running its migrations was a tenth of a first start."""
    upgrades = _alembic_upgrades(monkeypatch)
    db = Database(f"sqlite:///{tmp_path / 'meta.db'}")
    try:
        upgrade_to_head(db.engine, MIGRATIONS)
        assert upgrades == []
    finally:
        db.dispose()


def test_a_database_with_tables_but_no_version_goes_through_alembic(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a database with no table at all is built from the models; any other is left
    to Alembic, and what it holds stays."""
    upgrades = _alembic_upgrades(monkeypatch)
    db = Database(f"sqlite:///{tmp_path / 'meta.db'}")
    try:
        with db.engine.begin() as connection:
            connection.execute(text("CREATE TABLE unrelated (x INTEGER)"))
        head = upgrade_to_head(db.engine, MIGRATIONS)
        assert upgrades == ["head"]
        assert stored_revisions(db.engine) == [head]
        with db.engine.connect() as connection:
            names = {r[0] for r in connection.execute(text("SELECT name FROM sqlite_master"))}
        assert "unrelated" in names
    finally:
        db.dispose()
