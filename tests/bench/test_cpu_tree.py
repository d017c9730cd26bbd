"""bench/_cpu_tree.py: a phase's CPU by process kind, children included."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import _cpu_tree

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc (Linux)")

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"


def test_a_child_that_ran_in_the_phase_is_counted() -> None:
    before = _cpu_tree.snapshot()
    assert before[os.getpid()][0] == "bench"
    subprocess.run([sys.executable, "-c", BURN], check=True)  # reaped: our cutime
    figures = _cpu_tree.cpu_us_per_row(before, _cpu_tree.snapshot(), rows=1000)
    assert set(figures) == {*_cpu_tree.KINDS, "total"}
    assert figures["bench"] >= 250.0  # 0.3 s over 1000 rows, less a tick or two
    assert figures["total"] == pytest.approx(sum(figures[k] for k in _cpu_tree.KINDS), abs=0.5)


def test_processes_are_told_apart_by_their_command_line() -> None:
    java = "/usr/lib/jvm/java-17/bin/java -cp x org.apache.spark.deploy.SparkSubmit"
    assert _cpu_tree.kind_of(java) == "spark_jvm"
    assert _cpu_tree.kind_of("/venv/bin/python -m pyspark.daemon pyspark.worker") == (
        "spark_python"
    )
    assert _cpu_tree.kind_of("/venv/bin/python /venv/bin/quorra serve --data-dir d") == "server"
    assert _cpu_tree.kind_of("/venv/bin/python /venv/bin/quorra bench pipeline") == "bench"


def test_an_exited_process_takes_its_parents_kind() -> None:
    # An exited, unreaped process reads an empty command line: Spark's streaming source
    # runner, ended with its query, is Spark's Python, not the bench's.
    assert _cpu_tree.kind_of("", "spark_jvm") == "spark_python"
    assert _cpu_tree.kind_of("", "spark_python") == "spark_python"
    assert _cpu_tree.kind_of("", "server") == "server"
    assert _cpu_tree.kind_of("") == "bench"
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        stat = Path(f"/proc/{child.pid}/stat")
        while stat.read_text().rsplit(")", 1)[1].split()[0] != "Z":
            os.sched_yield()
        assert _cpu_tree.snapshot()[child.pid][0] == "bench"
    finally:
        child.wait()
