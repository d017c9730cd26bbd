"""Where one publish's time goes, stage by stage: a measuring aid, off unless asked for.

Rule: a ``PublishTrace`` holds one open row of ``monotonic_ns`` stamps, one per
``Stage``. ``RECEIVED`` opens a row (a publish frame was read); each later stage is
stamped once, only if the stage before it is stamped, so the stamps of a row are in the
order of the path whatever else runs between (another batch of the WAL, a timer's
proposal); ``SENT`` closes it (the confirm went to the socket). With one publish in
flight at a time (a window-1 stream, what ``quorra bench rest --trace-publish`` runs)
each row is one publish; a ``RECEIVED`` while a row is open drops that row
(``overlapped``), so overlapping publishes are never mixed into one row.

The stages are stamped where the publish passes: the stream endpoint (``RECEIVED``,
``SENT``), ``NodeContext.propose`` (``PROPOSED``, ``RESUMED``), the WAL (``SUBMITTED``
on the loop; ``TAKEN``, ``WRITTEN``, ``SYNCED`` in its writer thread, or on the loop
when it writes a lone publish itself: ``WalWriter.write_now``), ``Hosting``
(``ON_LOOP``: the loop took the finished batch) and ``Effects`` (``APPLIED``). The writer
thread stamps while the loop may open the next row: the worst a race does is drop a
stamp, and then the row, never misplace one.

Each site reads its trace as ``None`` when tracing is off: one attribute and a compare on
the hot path. Collections of the garbage collector are counted too (``gc.callbacks``),
with the time they took, since a collection that runs inside a publish's path is part
of its latency.
"""

from __future__ import annotations

import gc
from enum import IntEnum
from itertools import pairwise
from time import monotonic_ns
from typing import Any

import numpy as np


class Stage(IntEnum):
    RECEIVED = 0
    """The stream endpoint read the publish frame."""
    PROPOSED = 1
    """The leader steps the command into its Raft core."""
    SUBMITTED = 2
    """Its append is queued in the WAL (the writer woken if it was idle)."""
    TAKEN = 3
    """The writer thread took it into a batch."""
    WRITTEN = 4
    """The batch's write returned."""
    SYNCED = 5
    """The batch's fdatasync returned."""
    ON_LOOP = 6
    """The event loop picked the finished batch up."""
    APPLIED = 7
    """The machine applied the entry; the proposal's future is resolved."""
    RESUMED = 8
    """The publishing task runs again (``APPLIED``'s stamp when the confirm was sent
    from the apply, before the task resumed: a step of zero)."""
    SENT = 9
    """The confirm frame went to the socket."""


STAGES = tuple(Stage)
ROWS_MAX = 200_000
"""Publishes a trace keeps (16 bytes per stage each); later ones are counted, not kept."""


class PublishTrace:
    """The stamps of publishes made one at a time (see the module's rule)."""

    def __init__(self, rows_max: int = ROWS_MAX) -> None:
        assert rows_max > 0
        self._rows = np.zeros((rows_max, len(STAGES)), dtype=np.int64)
        self._kept = 0
        self._open: list[int] | None = None
        self.overlapped = 0
        """Rows dropped because another publish was read before the first was sent."""
        self.not_kept = 0
        """Rows completed after ``rows_max`` were kept."""
        self.gc_runs = 0
        self.gc_ns = 0
        """Collections of the garbage collector while tracing, and their total time."""
        self._gc_started = 0

    def stamp(self, stage: Stage) -> None:
        now = monotonic_ns()
        row = self._open
        if stage is Stage.RECEIVED:
            if row is not None:
                self.overlapped += 1
            self._open = [now] + [0] * (len(STAGES) - 1)
            return
        if row is None or row[stage]:
            return
        if not row[stage - 1]:
            if stage is not Stage.SENT or not row[Stage.APPLIED]:
                return
            # A confirm sent from the apply itself: no task resumed on its path.
            row[Stage.RESUMED] = row[Stage.APPLIED]
        row[stage] = now
        if stage is Stage.SENT:
            self._open = None
            if self._kept < len(self._rows):
                self._rows[self._kept] = row
                self._kept += 1
            else:
                self.not_kept += 1

    def install_gc_callback(self) -> None:
        gc.callbacks.append(self._on_gc)

    def remove_gc_callback(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = monotonic_ns()
        elif self._gc_started:
            self.gc_runs += 1
            self.gc_ns += monotonic_ns() - self._gc_started
            self._gc_started = 0

    def rows(self) -> np.ndarray[Any, np.dtype[np.int64]]:
        """The completed rows, one per publish, a column per stage."""
        return self._rows[: self._kept].copy()

    def summary(self) -> dict[str, Any]:
        """Per step from one stage to the next, and from the first to the last: the
        median, 99th percentile and maximum in microseconds, over the completed rows."""
        return summarize(self.rows()) | {
            "overlapped": self.overlapped,
            "not_kept": self.not_kept,
            "gc_runs": self.gc_runs,
            "gc_ms": round(self.gc_ns / 1e6, 3),
        }


def summarize(rows: np.ndarray[Any, np.dtype[np.int64]]) -> dict[str, Any]:
    steps: dict[str, dict[str, float]] = {}
    pairs = list(pairwise(STAGES))
    pairs.append((STAGES[0], STAGES[-1]))
    for a, b in pairs:
        us = (rows[:, b] - rows[:, a]) / 1000 if len(rows) else np.zeros(0)
        name = f"{a.name.lower()}->{b.name.lower()}"
        steps[name] = (
            {
                "p50_us": round(float(np.percentile(us, 50)), 1),
                "p99_us": round(float(np.percentile(us, 99)), 1),
                "max_us": round(float(us.max()), 1),
            }
            if len(us)
            else {}
        )
    return {"publishes": len(rows), "steps_us": steps}


__all__ = ["ROWS_MAX", "STAGES", "PublishTrace", "Stage", "summarize"]
