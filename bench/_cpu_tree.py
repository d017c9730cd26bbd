"""CPU time of this process and every process under it, by kind, from ``/proc``.

Rule: a phase's CPU is the difference of two ``snapshot``s taken around it. On a
machine shared with other work, wall-clock rates move with the load; the CPU a row
costs each process (the Spark JVM, its Python workers, the server, the bench and its
load generators) does much less, and says where a rate is lost. A process counts its
own time and that of its children it has reaped (``cutime``), so a load generator that
ended within the phase is counted in the bench's. Linux only: elsewhere the snapshot
is empty and every figure 0.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

KINDS = ("spark_jvm", "spark_python", "server", "bench")
_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True, slots=True)
class _Proc:
    ppid: int
    ticks: int
    """utime + stime + cutime + cstime."""


def _read(pid: int) -> tuple[_Proc, str] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:  # gone meanwhile, or no /proc
        return None
    # The command name may hold spaces and parentheses: the fields follow the last ")".
    fields = stat[stat.rindex(")") + 2 :].split()
    ticks = sum(int(fields[i]) for i in (11, 12, 13, 14))
    return _Proc(int(fields[1]), ticks), cmdline.decode(errors="replace")


def kind_of(cmdline: str, parent_kind: str = "bench") -> str:
    """The kind of a process by its command line. A process that has exited but not been
    reaped reads an empty one: it takes its parent's kind, Spark's Python if its parent
    is Spark's (the streaming source runner ends with its query, before the phase's
    second snapshot, and would count as the bench's)."""
    if not cmdline.strip():
        return "spark_python" if parent_kind.startswith("spark_") else parent_kind
    if "java" in cmdline.split(" ", 1)[0] or "org.apache.spark" in cmdline:
        return "spark_jvm"
    if "pyspark" in cmdline:
        return "spark_python"
    if " serve " in f"{cmdline} " and "quorra" in cmdline:
        return "server"
    return "bench"


def snapshot() -> dict[int, tuple[str, int]]:
    """pid -> (kind, CPU ticks so far) of this process and its descendants."""
    procs: dict[int, tuple[_Proc, str]] = {}
    proc_dir = Path("/proc")
    if not proc_dir.is_dir():
        return {}
    for entry in proc_dir.iterdir():
        if entry.name.isdigit() and (read := _read(int(entry.name))) is not None:
            procs[int(entry.name)] = read
    root = os.getpid()
    children: dict[int, list[int]] = {}
    for pid, (proc, _) in procs.items():
        children.setdefault(proc.ppid, []).append(pid)
    out: dict[int, tuple[str, int]] = {}
    todo = [(root, "bench")]
    while todo:
        pid, parent_kind = todo.pop()
        if pid in procs and pid not in out:
            proc, cmdline = procs[pid]
            kind = kind_of(cmdline, parent_kind)
            out[pid] = (kind, proc.ticks)
            todo.extend((child, kind) for child in children.get(pid, []))
    return out


def cpu_us_per_row(
    before: dict[int, tuple[str, int]], after: dict[int, tuple[str, int]], rows: int
) -> dict[str, float]:
    """Microseconds of CPU per row of each kind between two snapshots, and their total
    (processes that started in between count from zero)."""
    spent = dict.fromkeys(KINDS, 0.0)
    for pid, (kind, ticks) in after.items():
        spent[kind] += (ticks - before.get(pid, (kind, 0))[1]) / _TICKS_PER_S
    figures = {k: round(s * 1e6 / max(1, rows), 1) for k, s in spent.items()}
    figures["total"] = round(sum(spent.values()) * 1e6 / max(1, rows), 1)
    return figures
