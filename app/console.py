"""The command line's rich output: the stderr console and the progress bar of
``quorra publish`` and ``quorra consume``. Loaded by the commands that print, never by
``quorra serve``."""

from __future__ import annotations

from functools import cache

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text


@cache
def stderr_console() -> Console:
    return Console(stderr=True)


class RateColumn(ProgressColumn):
    """Messages per second, over rich's recent window."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text("" if speed is None else f"{speed:,.0f} msg/s", style="progress.data.speed")


def progress_bar(label: str) -> Progress:
    """A progress bar on stderr: label, bar, count, rate and time."""
    return Progress(
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        RateColumn(),
        TimeElapsedColumn(),
        console=stderr_console(),
        transient=False,
    )
