"""Short tails carried across a WAL roll, so that an idle log writes no segment per roll.

Rule: the WAL writer tracks, for each server, the entries written to the current file as
its log holds them (an append replaces the entries at its first index and after), while
they stay few (``Limits.wal_carry_entries_max`` and ``wal_carry_log_bytes_max``). At a
roll, the next file starts, after the hard states, with these runs again, as appends of
the same entries (up to ``wal_carry_bytes_max`` in all); their mem-table rows then
belong to the next file (``MemTable.carry``), and the flush of the rolled file writes no
segment for them. A restart of 10,000 idle queues rolls a file holding an entry or two
of each: written to segments, that is 10,000 files made and synced, about a millisecond
of kernel time each.

Why it loses nothing: the next file is durable, carried runs included, before the
rolled one may be deleted (after its flush). Until then a recovery replays both: the
carried append in the later file replaces the same entries with themselves. Nothing of
a server follows its carried run in the rolled file, since the run is everything it
wrote there. A file that starts a process carries nothing, so a run never comes from a
file that recovery skipped for a repair. A reset or a removal in a file makes the
server's run in it not carried (its log restarted, or it is gone).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.raft.entry import Entry


@dataclass(slots=True)
class CarryRuns:
    """Each server's run in the current WAL file, while it may be carried."""

    entries_max: int
    log_bytes_max: int
    runs: dict[str, list[Entry] | None] = field(default_factory=dict)
    """Per server: its entries in the file, or ``None`` once they may not be carried."""

    def appended(self, uid: str, entries: tuple[Entry, ...]) -> None:
        """Entries from ``entries[0].index`` replace the run's at that index and after."""
        run = self.runs.get(uid, [])
        if run is None:
            return
        first = entries[0].index
        if run:
            if first > run[-1].index + 1:  # not a log's append: never carried
                self.runs[uid] = None
                return
            del run[max(0, first - run[0].index) :]
        run.extend(entries)
        if len(run) > self.entries_max or sum(len(e.data) for e in run) > self.log_bytes_max:
            self.runs[uid] = None
        else:
            self.runs[uid] = run

    def not_carried(self, uid: str) -> None:
        """The server's log restarted or it is gone: its run stays in this file."""
        self.runs[uid] = None

    def take(self, bytes_max: int) -> dict[str, tuple[Entry, ...]]:
        """The runs to carry into the next file, in the order the servers first wrote
        to this one, while their data and per-entry overhead fit in ``bytes_max``; the
        runs then start again with them (they are the next file's)."""
        carried: dict[str, tuple[Entry, ...]] = {}
        left = bytes_max
        for uid, run in self.runs.items():
            if not run:
                continue
            size = sum(len(e.data) + CARRIED_ENTRY_BYTES for e in run)
            if size > left:
                continue
            left -= size
            carried[uid] = tuple(run)
        self.runs = {uid: list(run) for uid, run in carried.items()}
        return carried

    def clear(self) -> None:
        """A file that carries nothing starts."""
        self.runs = {}


CARRIED_ENTRY_BYTES = 64
"""What an entry of a carried run is counted for beside its data: its columns in the run
record (21 bytes) and a share of the record's header, rounded up."""


__all__ = ["CARRIED_ENTRY_BYTES", "CarryRuns"]
