"""Apply the Alembic migrations in ``migrations/`` to a database, programmatically.

The server does this at start-up and the local CLI commands before they touch the
database, so there is no separate migration step to forget.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine


def alembic_config(migrations_dir: Path, engine: Engine | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(migrations_dir))
    if engine is not None:
        config.set_main_option("sqlalchemy.url", engine.url.render_as_string(hide_password=False))
    return config


def upgrade_to_head(engine: Engine, migrations_dir: Path) -> str:
    """Migrate to the newest revision and return it."""
    config = alembic_config(migrations_dir, engine)
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "head")
    head = ScriptDirectory.from_config(config).get_current_head()
    assert head is not None, f"{migrations_dir} has no revision"
    assert current_revision(engine) == head
    return head


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()
