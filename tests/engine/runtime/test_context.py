"""The parts of a node share its ``NodeContext`` through public members only.

An AST scan, as ``tests/test_purity.py`` does: no module (engine, app, tests, bench)
reads or calls a private member of ``Node`` or ``NodeContext`` on anything but ``self``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
DEFINED_IN = {
    "Node": ROOT / "engine" / "runtime" / "node.py",
    "NodeContext": ROOT / "engine" / "runtime" / "context.py",
}
SCANNED = ("engine", "app", "tests", "bench", "pipeline")


def _private_members(path: Path, class_name: str) -> set[str]:
    """Names starting with one ``_`` that the class defines: methods and ``self._x``."""
    tree = ast.parse(path.read_text())
    cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == class_name)
    names = set()
    for node in ast.walk(cls):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
        ):
            names.add(node.attr)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def _reaches(path: Path, private: set[str]) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Attribute) or node.attr not in private:
            continue
        if isinstance(node.value, ast.Name) and node.value.id == "self":
            continue
        found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_private_members_are_known() -> None:
    assert "_heard_ms" in _private_members(DEFINED_IN["Node"], "Node")
    assert "_storage" in _private_members(DEFINED_IN["NodeContext"], "NodeContext")


def test_no_module_reaches_into_a_node_or_its_context() -> None:
    private: set[str] = set()
    for class_name, path in DEFINED_IN.items():
        private |= _private_members(path, class_name)
    found = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            found += _reaches(path, private)
    assert found == [], "\n".join(found)
