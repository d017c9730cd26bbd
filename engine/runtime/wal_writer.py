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

A lone small write of a one-member queue on an idle WAL skips the thread: the loop
``hold``s the writer (no wake-up), and at its next turn, if nothing else came, writes and
syncs it itself (``write_now``), the loop blocked for that one sync; else ``release``
wakes the thread. One writer at a time holds the writer's turn (a lock the loop only
tries), so batches stay in order. With one publish outstanding at a time this spares
the wake-up of the thread, the GIL handed to it and back and the wake-up of the loop:
on tmpfs 2.3 to 0.1 voluntary context switches and about a quarter of the server's
CPU per publish.

``stop`` writes what is pending and returns; ``stop(abandon=True)`` drops it, as a crash
would (the in-process failover tests use it).

The thread sleeps on an eventfd (a pipe where there is none, ``Wakeup``), not on a
``threading.Condition``: a condition's notify and wait are a dozen Python steps on each
side, each needing the GIL that the loop holds, around a fresh lock per wait. A wake-up
and the batch back to the loop took 45-50 us (p50) and 50 us of CPU that way, 18-22 us
and 20-25 us through the eventfd, on a loaded 2-core machine (a ping-pong of loop and
thread under uvloop, three alternating rounds). A wake-up given while the thread is not yet
asleep stays in the eventfd's counter, so none is lost between its check of ``pending``
and its sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import sys
import threading
from collections.abc import Callable

from engine.storage import Wal, WalBatch

_ONE = (1).to_bytes(8, sys.byteorder)
"""What a wake-up writes: an eventfd adds this 8-byte count to its counter; a pipe takes
the bytes as they are."""


class Wakeup:
    """A flag another thread sets (``set``) and the writer sleeps on (``wait``), through
    the kernel: an eventfd, or a pipe where the platform has none."""

    def __init__(self) -> None:
        if hasattr(os, "eventfd"):
            self._r = self._w = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        else:  # pragma: no cover - not Linux
            self._r, self._w = os.pipe()
            os.set_blocking(self._r, False)
            os.set_blocking(self._w, False)
        self._poll = select.poll()
        self._poll.register(self._r, select.POLLIN)
        self._lock = threading.Lock()
        """Held to write and to close: a late ``set`` (a submit racing a stop) must not
        write to a descriptor closed and perhaps reused meanwhile."""
        self._closed = False

    def set(self) -> None:
        with self._lock:
            if self._closed:
                return
            # The counter or the pipe full: a wake-up is pending already.
            with contextlib.suppress(BlockingIOError):
                os.write(self._w, _ONE)

    def clear(self) -> None:
        with contextlib.suppress(BlockingIOError):  # not set
            os.read(self._r, 4096)

    def fileno(self) -> int:
        """The descriptor that reads as ready while set (for a loop's ``add_reader``)."""
        return self._r

    def wait(self, timeout_s: float) -> bool:
        """Sleep until set or ``timeout_s`` passed (the GIL released meanwhile); whether
        it was set. It stays set: ``clear`` is a call of its own."""
        return bool(self._poll.poll(max(0, round(timeout_s * 1000))))

    def close(self) -> None:
        """Once the sleeping thread has ended; a ``set`` after it does nothing."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            os.close(self._r)
            if self._w != self._r:
                os.close(self._w)


class LoopWakeup:
    """Runs ``callback`` on ``loop`` when another thread calls ``set``, the GIL released
    while that thread wakes the loop.

    ``call_soon_threadsafe`` writes the loop's wake-up with the GIL held: the loop, woken
    (often on the same core, ahead of the writer), finds the GIL taken and sleeps again
    until the writer lets it go, two more switches before each finished batch is taken
    (py-spy --gil: a tenth of the GIL's time in a window-1 stream spent in that write).
    Here the write releases the GIL first, so the woken loop takes it at once; the
    writer takes it back once the loop waits again.

    While the other thread has nothing more to do (``busy`` false: the WAL has nothing
    pending), the callback runs before the wake-up is cleared, and once more after: the
    clear's read gives the GIL up, and the writer, which has waited for it since its
    wake-up's write, would take it there, only to go to sleep, two switches in the
    middle of the batch's way to its callers (window-1 on tmpfs: 2.7 to 2.1 voluntary
    context switches per publish). After the callback that hand-over costs nothing
    that waits for it. A ``set`` during the first run is cleared by the read, and the
    second run takes what it was for; a ``set`` after the read runs it once more, so
    none is lost. The callback must so take whatever is there, and cost little when it
    finds nothing. While it is busy, the wake-up is cleared first, as the writer then
    takes the GIL at the read to start its next batch, whose write and sync go on while
    the callback runs (under load the callback applies a whole batch: the writer kept
    from the GIL that long, streams of publishes ran at half the rate). Made and closed
    on the loop."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        callback: Callable[[], None],
        busy: Callable[[], bool] = lambda: False,
    ) -> None:
        self._loop = loop
        self._callback = callback
        self._busy = busy
        self._wakeup = Wakeup()
        loop.add_reader(self._wakeup.fileno(), self._woken)

    def set(self) -> None:
        self._wakeup.set()

    def _woken(self) -> None:
        callback = self._callback
        if self._busy():
            self._wakeup.clear()
            callback()
            return
        callback()
        self._wakeup.clear()
        callback()

    def close(self) -> None:
        self._loop.remove_reader(self._wakeup.fileno())
        self._wakeup.close()


LONE_BATCH_BYTES_MAX = 16 * 1024
"""At most this many bytes pending for ``write_now`` to write them on the loop: a sync of
a few kilobytes takes as long as one of a few hundred bytes, a larger batch is the sign
of concurrent callers, whose work the writer thread's sync would overlap."""


class WalWriter:
    def __init__(self, wal: Wal, on_batch: Callable[[WalBatch], None]) -> None:
        self._wal = wal
        self._on_batch = on_batch
        self._wakeup = Wakeup()
        self._stopping = False
        self._abandon = False
        self._roll_wanted = False
        self._writing = False
        self._turn = threading.Lock()
        """Held by whoever writes the WAL (the thread, or the loop in ``write_now``) from
        its ``write_batch`` or roll until the batch is handed on: one writer at a time,
        and the batches reach the loop in the order they were written."""
        self._held = False
        """Set by ``hold``: a submit does not wake the thread until ``release``."""
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
        """After a submit that found nothing pending. While a batch is being written the
        thread is awake and looks at what is pending once it is done (``_writing`` is
        cleared only after that batch is handed on), so the wake-up, a system call, is
        not needed then: under load each batch's first submit came while the one
        before was being synced. While held (``hold``), ``release`` wakes it instead."""
        if not self._writing and not self._held:
            self._wakeup.set()

    def hold(self) -> None:
        """On the loop, before a lone submit that ``write_now`` may write itself: the
        thread is not woken for it (a wake-up, and the GIL handed to the thread and back,
        for nothing) until ``release``, which must follow in the same or the next turn
        of the loop. The thread may still take what is pending meanwhile (after its idle
        wait), as it would anyway."""
        self._held = True

    def release(self) -> None:
        """End a ``hold``: wake the thread for whatever is pending."""
        self._held = False
        if self._wal.pending():
            self._wakeup.set()

    def write_now(self, in_order: Callable[[], bool]) -> WalBatch | None:
        """On the loop: write and sync what is pending here, with the loop blocked for
        it, and return the batch (durable unless its ``error`` is set) for the caller
        to complete; or None, leaving it to the thread, when the thread is writing,
        nothing is pending, more than ``LONE_BATCH_BYTES_MAX`` bytes are, or
        ``in_order`` (asked once the writer's turn is taken) says a batch the thread
        handed over is not yet taken by the loop.

        For a lone small write on an idle WAL: the thread's way costs a wake-up of the
        thread, the GIL handed to it and back, and a wake-up of the loop, several
        hundred microseconds when the sync itself takes a few hundred."""
        wal = self._wal
        if self._writing or self._stopping or not wal.pending():
            return None
        if wal.pending_bytes() > LONE_BATCH_BYTES_MAX:
            return None
        if not self._turn.acquire(blocking=False):
            return None
        try:
            if not wal.pending() or not in_order():
                return None
            return wal.write_batch()
        finally:
            self._turn.release()

    def request_roll(self) -> None:
        """Roll the current file once what is pending is written, as after an idle
        period: the memory alarm asks for it, so that the mem tables it counts empty
        even while consumers keep the WAL busy."""
        self._roll_wanted = True  # set before the wake-up, so the woken thread sees it
        self._wakeup.set()

    def stop(self, *, abandon: bool = False) -> None:
        self._abandon = abandon
        self._stopping = True
        self._wakeup.set()
        if self._thread.is_alive():
            self._thread.join()
        self._wal.waker = None
        self._wakeup.close()

    def _run(self) -> None:
        wal, wakeup = self._wal, self._wakeup
        cleared = False  # since the last clear, no wait returned: a set since is fresh
        while True:
            idle = False
            while not wal.pending() and not self._stopping and not idle:
                # The last wake-up is cleared on the way to sleep, not after a wake: the
                # read gives the GIL up and takes it back, which a woken writer would pay
                # before its write (up to a switch interval, 5 ms, on a busy loop). The
                # checks after the clear see a submit made before it; one made after it
                # sets the wake-up again, and the wait returns at once.
                if not cleared:
                    wakeup.clear()
                    cleared = True
                    if wal.pending() or self._stopping:
                        break
                if self._roll_wanted or not wakeup.wait(wal.idle_roll_s):
                    idle = True
                else:
                    cleared = False
            if self._stopping and (self._abandon or not wal.pending()):
                return
            roll = idle and not wal.pending()
            if roll:
                self._roll_wanted = False
            with self._turn:
                if not roll:
                    if not wal.pending():  # the loop wrote it (``write_now``)
                        continue
                    self._writing = True
                    batch = self._wal.write_batch()
                    # Cleared before the batch goes back, while the loop waits for it:
                    # after the hand-over the loop runs, and a read then would give it
                    # the GIL and wait for it back before this thread could sleep.
                    # Nothing set it meanwhile but a wake-up the pending checks below
                    # see anyway.
                    wakeup.clear()
                    cleared = True
                    self._on_batch(batch)
                    self._writing = False
                elif (rolled := self._wal.roll_if_written()) is not None:
                    self._on_batch(rolled)


__all__ = ["LoopWakeup", "Wakeup", "WalWriter"]
