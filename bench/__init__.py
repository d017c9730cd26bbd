"""Benchmarks. ``quorra bench NAME [FLAGS]`` runs ``bench/<NAME>.py``; ``quorra bench
--help`` lists them, ``quorra bench NAME --help`` shows the flags of one.

Every bench module keeps one contract, which ``tests/bench/test_benches.py`` checks for every
name ``available()`` returns (so a new bench is covered as soon as it exists):

* the first line of its docstring says what it measures, in one line (the listing);
* ``JSON_KEYS: tuple[str, ...]``: the top-level keys of the JSON object it prints,
  stable from run to run, each listed on a line of its own in the module docstring
  (````key``: meaning``);
* ``HEADLINE_KEY: str``: the one figure to quote, a member of ``JSON_KEYS``, which the
  docstring names as the headline; a figure measured per size is printed both per size
  and, at the size the docstring names, under the headline key;
* ``main(argv: list[str]) -> int`` parses its flags with argparse (``parser()`` here:
  ``--help``, ``--json``, ``--quick``) and prints one JSON object on stdout. ``--quick``
  is a smoke run: small sizes, one round, seconds, the same keys as a full run;
* the JSON starts with ``header()``: the bench's name and ``machine_info()`` taken when
  the bench starts, load average and CPU frequency governor included, so that figures of
  two runs can be compared.

Figures are measured, never hard-coded.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import os
import pkgutil
import platform
import sys
from typing import Any

GOVERNOR_PATH = "/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"


def available() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def run(name: str, argv: list[str]) -> int:
    if name in ("", "-h", "--help"):
        print(listing())
        return 0 if name else 2
    if name not in available():
        print(f"unknown bench {name!r}\n\n{listing()}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"bench.{name}")
    return int(module.main(argv))


def listing() -> str:
    """Usage and one line per bench: the first line of its docstring, read from the
    source so that the listing imports none of them (the UI bench loads the whole app)."""
    names = available()
    width = max(map(len, names))
    lines = [f"  {name:{width}}  {summary(name)}" for name in names]
    return (
        "usage: quorra bench NAME [--json] [--quick] [FLAGS]\n"
        "       quorra bench NAME --help   (the flags and JSON keys of one bench)\n\n"
        "benches:\n" + "\n".join(lines)
    )


def summary(name: str) -> str:
    spec = importlib.util.find_spec(f"bench.{name}")
    assert spec is not None and spec.origin is not None, name
    with open(spec.origin, encoding="utf-8") as f:
        doc = ast.get_docstring(ast.parse(f.read())) or ""
    return doc.strip().split("\n", 1)[0]


def parser(name: str, doc: str | None) -> argparse.ArgumentParser:
    """The argument parser of ``quorra bench NAME``: its docstring as the description,
    ``--json`` and ``--quick``; the bench adds its own flags."""
    p = argparse.ArgumentParser(
        prog=f"quorra bench {name}",
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: small sizes and one round, in seconds; the same JSON keys",
    )
    return p


def header(name: str) -> dict[str, Any]:
    """The start of every bench's JSON; call it before measuring (the load average)."""
    return {"bench": name, "machine": machine_info()}


def machine_info() -> dict[str, Any]:
    """What the figures were measured on, included in every bench's JSON: the load
    average (1, 5, 15 min) and the CPU frequency governor move a figure between runs."""
    return {
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "cpu_governor": _cpu_governor(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "cpu_model": _cpu_model(),
    }


def _cpu_governor() -> str:
    try:
        with open(GOVERNOR_PATH, encoding="ascii") as f:
            return f.read().strip() or "unknown"
    except OSError:
        return "unknown"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
