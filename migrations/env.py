"""Alembic environment for Quorra's metadata database.

The server runs migrations itself (``app.db.migrate.upgrade_to_head``) and hands its
connection in ``config.attributes["connection"]``. By hand:
``alembic -c migrations/alembic.ini -x db=data/meta.sqlite3 revision --autogenerate -m "..."``.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from app.db.models import Base
from app.db.session import create_db_engine

target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=True,  # SQLite alters tables by copying them
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    db_path = context.get_x_argument(as_dictionary=True).get("db")
    url = f"sqlite:///{db_path}" if db_path else context.config.get_main_option("sqlalchemy.url")
    assert url, "pass -x db=PATH/meta.sqlite3"
    engine = create_db_engine(url)
    with engine.begin() as conn:
        _run(conn)
    engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (SQL script) migrations are not supported")
run_migrations_online()
