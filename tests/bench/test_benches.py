"""Every bench keeps the contract of ``bench/__init__.py``; ``BENCHES`` names them all and
a test fails when ``bench.available()`` holds one it does not name: its smoke
run, ``quorra bench NAME --quick --json`` (the real command, in a subprocess), prints
exactly its documented ``JSON_KEYS``, the headline and every measured figure a positive
number; its docstring lists each key; ``quorra bench --help`` lists it and
``quorra bench NAME --help`` shows its flags. Full runs stay out of the suite.

The smoke runs of the selected benches start together, when the first of their tests
runs, and each test waits for its own: they spend most of their time waiting (for a
server, a JVM, a disk, their load generators' start), so the file takes about as long
as the slowest one, the pipeline's SparkSession, rather than the sum.

The helpers of the benches are covered through them: ``bench rest``'s stream phases run
the generators of ``bench/_stream_load.py``, and the proxy of ``bench/_proxy.py`` has tests
of its own (``tests/cluster/test_proxy.py``).
"""

from __future__ import annotations

import importlib
import json
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import bench
from app.cli import cli

QUORRA = str(Path(sys.executable).with_name("quorra"))
QUICK_TIMEOUT_S = 300.0
MARKS: dict[str, list[pytest.MarkDecorator]] = {
    "cluster": [pytest.mark.integration],
    "deep": [pytest.mark.integration],
    "pipeline": [pytest.mark.spark, pytest.mark.integration],
    "rest": [pytest.mark.integration],
    "restart": [pytest.mark.integration],
}
"""Benches that start a real server process (integration) or PySpark (spark)."""
UNIT_WORDS = {"s", "ms", "bytes", "mb", "per", "ratio", "vs"}
"""A top-level figure whose name holds one of these words (``publish_msgs_per_s``,
``recovery_ms``, ``checkpoint_bytes``, ``publish_ratio``) is a measurement or a size,
and must be positive; counts such as ``paced_timed_out`` may be 0."""
BENCHES = (
    "cluster",
    "compaction",
    "deep",
    "machine",
    "pipeline",
    "raft",
    "recovery",
    "rest",
    "restart",
    "ui",
    "wal",
)
"""Every bench by name, so that each one's smoke run is visibly in the suite;
``test_every_bench_is_listed`` fails when a bench is added without its name here."""
NAMES = [pytest.param(name, marks=MARKS.get(name, [])) for name in BENCHES]


def test_every_bench_is_listed() -> None:
    assert tuple(bench.available()) == BENCHES


class QuickRun:
    """``quorra bench NAME --quick --json`` in a subprocess, its output in files (the
    pipeline's Spark log would fill a pipe while another run is being waited for)."""

    def __init__(self, name: str, directory: Path) -> None:
        self.name = name
        self.stdout = (directory / f"{name}.out").open("w+b")
        self.stderr = (directory / f"{name}.err").open("w+b")
        command = [QUORRA, "bench", name, "--quick", "--json"]
        self.proc = subprocess.Popen(command, stdout=self.stdout, stderr=self.stderr)

    def result(self) -> dict[str, Any]:
        try:
            code = self.proc.wait(QUICK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.stop()
            pytest.fail(f"bench {self.name} --quick ran over {QUICK_TIMEOUT_S} s")
        self.stderr.seek(0)
        log = self.stderr.read().decode(errors="replace")[-4000:]
        assert code == 0, f"bench {self.name} --quick exited with {code}:\n{log}"
        self.stdout.seek(0)
        out = self.stdout.read().decode()
        try:
            result: dict[str, Any] = json.loads(out)
        except json.JSONDecodeError:
            pytest.fail(f"bench {self.name} --quick --json printed no JSON:\n{out[-2000:]}")
        return result

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.stdout.close()
        self.stderr.close()


@pytest.fixture(scope="module")
def quick_runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, QuickRun]]:
    """The smoke runs of the benches whose test is selected, all started at once."""
    selected = [
        item.callspec.params["name"]
        for item in request.session.items
        if getattr(item, "originalname", "") == "test_quick_run_prints_its_keys_and_figures"
    ]
    directory = tmp_path_factory.mktemp("bench-quick")
    runs = {name: QuickRun(name, directory) for name in selected}
    yield runs
    for run in runs.values():
        run.stop()


@pytest.mark.parametrize("name", NAMES)
def test_quick_run_prints_its_keys_and_figures(name: str, quick_runs: dict[str, QuickRun]) -> None:
    module = importlib.import_module(f"bench.{name}")
    result = quick_runs[name].result()
    assert set(result) == set(module.JSON_KEYS), sorted(set(result) ^ set(module.JSON_KEYS))
    assert result["bench"] == name
    machine = result["machine"]
    assert len(machine["load_average"]) == 3 and isinstance(machine["cpu_governor"], str)
    assert _positive(result[module.HEADLINE_KEY]), (module.HEADLINE_KEY, result)
    for key in module.JSON_KEYS:
        value = result[key]
        assert value is not None, key
        if isinstance(value, int | float) and UNIT_WORDS & set(key.split("_")):
            assert _positive(value), (key, value)
    assert not list(_non_finite(result))


@pytest.mark.parametrize("name", BENCHES)
def test_module_documents_its_keys_and_headline(name: str) -> None:
    module = importlib.import_module(f"bench.{name}")
    doc = module.__doc__ or ""
    keys, headline = module.JSON_KEYS, module.HEADLINE_KEY
    assert isinstance(keys, tuple) and len(set(keys)) == len(keys) and "bench" in keys
    assert headline in keys
    lines = doc.splitlines()
    for key in keys:
        listed = [line for line in lines if line.lstrip("* ").startswith(f"``{key}``:")]
        assert len(listed) == 1, f"{name}: {key} is not listed once in the docstring"
    assert any("headline" in line and f"``{headline}``" in line for line in lines), name


def test_bench_help_lists_every_bench_with_its_summary() -> None:
    got = CliRunner().invoke(cli, ["bench", "--help"])
    assert got.exit_code == 0, got.output
    for name in bench.available():
        summary = bench.summary(name)
        assert summary and summary in got.output, name
        assert any(line.split()[:1] == [name] for line in got.output.splitlines()), name


@pytest.mark.parametrize("name", BENCHES)
def test_bench_name_help_shows_its_flags(name: str) -> None:
    got = CliRunner().invoke(cli, ["bench", name, "--help"])
    assert got.exit_code == 0, got.output
    assert f"usage: quorra bench {name}" in got.output
    assert "--quick" in got.output and "--json" in got.output


def test_unknown_bench_is_refused_with_the_list() -> None:
    got = CliRunner().invoke(cli, ["bench", "no-such-bench"])
    assert got.exit_code == 2
    assert "unknown bench 'no-such-bench'" in got.output
    assert all(name in got.output for name in bench.available())


def _positive(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def _non_finite(value: object, path: str = "") -> Iterator[str]:
    """Paths of the NaN and infinite numbers in a parsed JSON value."""
    if isinstance(value, float) and not math.isfinite(value):
        yield path
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _non_finite(item, f"{path}.{key}")
    elif isinstance(value, list):
        for n, item in enumerate(value):
            yield from _non_finite(item, f"{path}[{n}]")
