"""Benchmarks. Each module ``bench/<name>.py`` has ``main(argv: list[str]) -> int`` that
prints one JSON object of figures on stdout; ``quorra bench NAME [ARGS]`` runs it.

Figures are measured, never hard-coded; every bench names the machine it ran on.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import platform
import sys
from typing import Any


def available() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def run(name: str, argv: list[str]) -> int:
    if name not in available():
        print(f"unknown bench {name!r}; available: {', '.join(available())}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"bench.{name}")
    return int(module.main(argv))


def machine_info() -> dict[str, Any]:
    """What the figures were measured on, included in every bench's JSON."""
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "cpu_model": _cpu_model(),
    }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
