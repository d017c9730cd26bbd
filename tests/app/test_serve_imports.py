"""``quorra serve`` imports only what serving needs: every module costs start-up time
(``quorra bench restart``: ``empty_start_ms``), and PySpark, pandas or the bench code
would cost seconds."""

from __future__ import annotations

import sys
from pathlib import Path

from alembic.script import ScriptDirectory

from app.db.migrate import alembic_config, script_head
from app.settings import PROJECT_ROOT
from tests.app.conftest import Server

GC_ENABLED = "gc-enabled"
"""The listing's last line when the server ended with the garbage collector on: ``serve``
turns it off while it starts (app/cli.py) and back on once ready (app/main.py)."""

# The CLI's own `serve`, with the modules loaded by the time the process ends written
# to a file (argv[1]); the rest of argv is the command line after `quorra`.
_SERVE_LISTING_MODULES = """
import atexit, gc, sys
out = sys.argv[1]
sys.argv = ["quorra", *sys.argv[2:]]

@atexit.register
def write_modules():
    with open(out, "w") as f:
        f.write("\\n".join(sorted(sys.modules)))
        f.write("\\nGC_ENABLED" if gc.isenabled() else "")

from app.cli import main
main()
""".replace("GC_ENABLED", GC_ENABLED)

NEVER = ("pyspark", "pandas", "pyarrow", "bench", "pipeline", "tests")
NOT_AT_START = ("alembic", "mako", "httpx", "rich", "jinja2")
"""Loaded only when needed: migrations from an older revision, the client commands, the
dashboard's first page (its templates)."""


class ModuleListingServer(Server):
    def __init__(self, data_dir: Path, listing: Path) -> None:
        super().__init__(data_dir)
        self.listing = listing

    def command(self) -> list[str]:
        return [sys.executable, "-c", _SERVE_LISTING_MODULES, str(self.listing), *super().command()[1:]]  # fmt: skip


def _served_modules(data_dir: Path, listing: Path) -> set[str]:
    server = ModuleListingServer(data_dir, listing).start()
    server.stop()
    return {name.split(".")[0] for name in listing.read_text().split()}


def test_serve_imports_no_spark_pandas_bench_alembic_rich_nor_jinja(tmp_path: Path) -> None:
    """Neither at the first start (the new database is built from the models) nor at the
    next (it is at the head already)."""
    first = _served_modules(tmp_path / "data", tmp_path / "first.txt")
    assert "fastapi" in first and "engine" in first  # the listing is the server's
    assert not first & {*NEVER, *NOT_AT_START}
    assert GC_ENABLED in first  # collection off while starting only
    again = _served_modules(tmp_path / "data", tmp_path / "again.txt")
    assert not again & {*NEVER, *NOT_AT_START}


def test_the_head_read_from_the_migration_files_is_alembics() -> None:
    migrations = PROJECT_ROOT / "migrations"
    alembics = ScriptDirectory.from_config(alembic_config(migrations)).get_current_head()
    assert script_head(migrations) == alembics


def test_no_head_is_read_when_the_files_branch(tmp_path: Path) -> None:
    versions = tmp_path / "versions"
    versions.mkdir()
    (versions / "a.py").write_text("revision = 'a'\ndown_revision = None\n")
    (versions / "b.py").write_text("revision: str = 'b'\ndown_revision: str | None = 'a'\n")
    assert script_head(tmp_path) == "b"
    (versions / "c.py").write_text("revision = 'c'\ndown_revision = 'a'\n")
    assert script_head(tmp_path) is None  # two heads: Alembic decides
    (versions / "c.py").write_text("revision = 'c'\ndown_revision = compute()\n")
    assert script_head(tmp_path) is None
