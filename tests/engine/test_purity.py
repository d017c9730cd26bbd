"""The pure core imports no I/O, clock, randomness or threading (STYLE.md, principle 1),
and nothing in engine/ imports the app's frameworks."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN_IN_CORE = {
    "asyncio",
    "socket",
    "time",
    "random",
    "os",
    "threading",
    "sqlite3",
    "subprocess",
    "selectors",
    "datetime",
    "io",
    "pathlib",
    "shutil",
}
FORBIDDEN_IN_ENGINE = {"fastapi", "sqlalchemy", "starlette", "jinja2", "app", "pipeline"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("package", ["raft", "queue", "cluster"])
def test_core_packages_are_pure(package: str) -> None:
    files = sorted((ROOT / "engine" / package).rglob("*.py"))
    assert files, f"engine/{package} has no modules"
    for path in files:
        bad = _imports(path) & FORBIDDEN_IN_CORE
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_engine_does_not_import_the_app_frameworks() -> None:
    for path in sorted((ROOT / "engine").rglob("*.py")):
        bad = _imports(path) & FORBIDDEN_IN_ENGINE
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_the_replica_driver_is_pure() -> None:
    """The server and the simulator run the same driver: it may hold no event loop,
    clock or I/O of its own (engine/runtime/driver.py)."""
    path = ROOT / "engine" / "runtime" / "driver.py"
    bad = _imports(path) & FORBIDDEN_IN_CORE
    assert not bad, f"engine/runtime/driver.py imports {sorted(bad)}"
