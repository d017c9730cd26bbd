"""The WAL writer thread of a node: group commit off the event loop.

Rule: the loop submits operations through ``NodeStorage`` (which queues them in the
shared ``Wal``) and then calls ``wake``; this thread takes everything pending in one
``Wal.write_batch`` (one write, one fdatasync) and hands the batch back with
``on_batch``, which the node forwards to its loop. While a sync runs, more operations
gather, so batches grow with load by themselves.

After ``wal_idle_roll_ms`` with nothing to write, it rolls a file that holds anything
(``Wal.roll_if_written``) and hands that batch on too: the rolled file's entries go to
segments and leave the mem tables, so an idle node holds no message bodies in memory
and the memory alarm, which counts them, clears by itself.

``stop`` writes what is pending and returns; ``stop(abandon=True)`` drops it, as a crash
would (the in-process failover tests use it).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from engine.storage import Wal, WalBatch


class WalWriter:
    def __init__(self, wal: Wal, on_batch: Callable[[WalBatch], None]) -> None:
        self._wal = wal
        self._on_batch = on_batch
        self._cond = threading.Condition()
        self._stopping = False
        self._abandon = False
        self._roll_wanted = False
        self._writing = False
        self._thread = threading.Thread(target=self._run, name="quorra-wal", daemon=True)
        wal.waker = self.wake  # a submit that finds nothing pending (also from storage) wakes it

    def start(self) -> None:
        self._thread.start()

    @property
    def idle(self) -> bool:
        """Nothing pending and no batch being written: a write submitted now starts at
        once. Read on the loop without the lock: a stale answer only changes how the
        next proposals are grouped, never what is durable."""
        return not self._writing and not self._wal.pending()

    def wake(self) -> None:
        with self._cond:
            self._cond.notify()

    def request_roll(self) -> None:
        """Roll the current file once what is pending is written, as after an idle
        period: the memory alarm asks for it, so that the mem tables it counts empty
        even while consumers keep the WAL busy."""
        with self._cond:
            self._roll_wanted = True
            self._cond.notify()

    def stop(self, *, abandon: bool = False) -> None:
        with self._cond:
            self._stopping = True
            self._abandon = abandon
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join()
        self._wal.waker = None

    def _run(self) -> None:
        while True:
            idle = False
            with self._cond:
                while not self._wal.pending() and not self._stopping and not idle:
                    idle = self._roll_wanted or not self._cond.wait(self._wal.idle_roll_s)
                if self._stopping and (self._abandon or not self._wal.pending()):
                    return
                roll = idle and not self._wal.pending()
                if roll:
                    self._roll_wanted = False
                else:
                    self._writing = True
            if not roll:
                self._on_batch(self._wal.write_batch())
                self._writing = False
            elif (rolled := self._wal.roll_if_written()) is not None:
                self._on_batch(rolled)


__all__ = ["WalWriter"]
