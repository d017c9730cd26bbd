"""Apply the Alembic migrations in ``migrations/`` to a database, programmatically.

The server does this at start-up and the local CLI commands before they touch the
database, so there is no separate migration step to forget.

A database already at the head revision is the common case at start-up; it is told
apart without importing Alembic (about 100 ms with Mako and Pygments, a tenth of the
start-up of ``quorra serve``): the head is read from the ``revision`` and
``down_revision`` lines of the migration files, the database's from its
``alembic_version`` table. Whenever that reading is not plain (no single head, a line
that is not a literal), Alembic decides.

A new database (no table at all) is built from the models and stamped at the head, as
Alembic's documentation advises for a database built from scratch: the same schema as
running every migration (``tests/app/test_migrations.py`` compares the two), for a tenth
of the time of importing Alembic and running them at a first start.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, text
from sqlalchemy.exc import OperationalError

if TYPE_CHECKING:
    from alembic.config import Config

_REVISION_LINE = re.compile(r"^(revision|down_revision)\s*(?::[^=\n]*)?=\s*(.+)$", re.MULTILINE)


def alembic_config(migrations_dir: Path, engine: Engine | None = None) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(migrations_dir))
    if engine is not None:
        config.set_main_option("sqlalchemy.url", engine.url.render_as_string(hide_password=False))
    return config


def upgrade_to_head(engine: Engine, migrations_dir: Path) -> str:
    """Migrate to the newest revision and return it."""
    head = script_head(migrations_dir)
    if head is not None and stored_revisions(engine) == [head]:
        return head
    if head is not None and _has_no_table(engine):
        create_at_head(engine, head)
        return head
    from alembic import command
    from alembic.script import ScriptDirectory

    config = alembic_config(migrations_dir, engine)
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "head")
    head = ScriptDirectory.from_config(config).get_current_head()
    assert head is not None, f"{migrations_dir} has no revision"
    assert current_revision(engine) == head
    return head


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def script_head(migrations_dir: Path) -> str | None:
    """The one head revision of ``migrations_dir/versions``, from the files' text;
    None when there is not exactly one or a file's revision lines are not literals."""
    revisions: set[str] = set()
    parents: set[str] = set()
    for path in sorted((migrations_dir / "versions").glob("*.py")):
        found = dict(
            (name, _literal(value)) for name, value in _REVISION_LINE.findall(path.read_text())
        )
        revision, down = found.get("revision"), found.get("down_revision")
        if not isinstance(revision, str) or "down_revision" not in found:
            return None
        revisions.add(revision)
        if isinstance(down, str):
            parents.add(down)
        elif isinstance(down, tuple) and all(isinstance(d, str) for d in down):
            parents.update(down)
        elif down is not None:
            return None
    heads = revisions - parents
    return heads.pop() if len(heads) == 1 else None


def create_at_head(engine: Engine, head: str) -> None:
    """The models' tables and ``alembic_version`` at ``head``, in one transaction."""
    from app.db.models import Base

    with engine.begin() as connection:
        Base.metadata.create_all(connection)
        connection.execute(
            text(
                "CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL, "
                "CONSTRAINT alembic_version_pkc PRIMARY KEY (version_num))"
            )
        )
        connection.execute(text("INSERT INTO alembic_version VALUES (:head)"), {"head": head})


def _has_no_table(engine: Engine) -> bool:
    with engine.connect() as connection:
        return connection.execute(text("SELECT count(*) FROM sqlite_master")).scalar() == 0


def stored_revisions(engine: Engine) -> list[str]:
    """The revisions in the database's ``alembic_version`` table; none before the first
    migration."""
    try:
        with engine.connect() as connection:
            rows = connection.execute(text("SELECT version_num FROM alembic_version"))
            return [str(row[0]) for row in rows]
    except OperationalError:  # no such table
        return []


def _literal(value: str) -> Any:
    try:
        return ast.literal_eval(value.strip())
    except (ValueError, SyntaxError):
        return _NOT_LITERAL


_NOT_LITERAL = object()
