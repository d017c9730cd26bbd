"""The WAL writer thread: woken at once by a submit, never loses a wake-up given before
it sleeps, rolls an idle file or when asked, writes what is pending at a stop."""

from __future__ import annotations

import asyncio
import queue
import random
import threading
import time
from collections import deque
from collections.abc import Callable

import pytest
import uvloop

from engine.runtime.wal_writer import LONE_BATCH_BYTES_MAX, LoopWakeup, Wakeup, WalWriter
from engine.storage import FakeDisk, NodeStorage, Persisted, WalBatch
from engine.storage.wal import AppendOp
from tests.engine.storage.conftest import entries, small_limits

WAIT_S = 10.0


def _storage(**limits: int) -> NodeStorage:
    storage = NodeStorage.open(FakeDisk(), small_limits(wal_file_bytes_max=1 << 20, **limits))
    storage.open_server("q")
    return storage


def test_a_wake_up_given_before_the_wait_stays_until_cleared() -> None:
    wakeup = Wakeup()
    try:
        wakeup.set()
        wakeup.set()
        assert wakeup.wait(WAIT_S) and wakeup.wait(WAIT_S)
        wakeup.clear()  # both sets were one wake-up
        started = time.monotonic()
        assert not wakeup.wait(0.05)
        assert time.monotonic() - started >= 0.04
        wakeup.clear()  # clearing what is not set is nothing
    finally:
        wakeup.close()
    wakeup.set()  # after close: nothing, and no write to a descriptor reused meanwhile
    wakeup.close()


def test_a_wake_up_from_another_thread_ends_the_wait() -> None:
    wakeup = Wakeup()
    try:
        timer = threading.Timer(0.05, wakeup.set)
        timer.start()
        started = time.monotonic()
        assert wakeup.wait(WAIT_S)
        assert time.monotonic() - started < WAIT_S / 2
        timer.join()
    finally:
        wakeup.close()


class _Handover:
    """A writer's hand-over to the loop as ``Hosting`` makes it: items appended, the
    loop woken only while no drain is due, the flag cleared before a drain takes any."""

    def __init__(self, loop: asyncio.AbstractEventLoop, busy: bool) -> None:
        self.items: deque[int] = deque()
        self.taken: list[int] = []
        self.due = False
        self.on_drain: Callable[[], None] = lambda: None
        self.wakeup = LoopWakeup(loop, self.drain, lambda: busy)

    def hand(self, item: int) -> None:
        self.items.append(item)
        if not self.due:
            self.due = True
            self.wakeup.set()

    def drain(self) -> None:
        self.due = False
        while self.items:
            self.taken.append(self.items.popleft())
        self.on_drain()


@pytest.mark.parametrize("busy", [False, True])
def test_a_hand_over_during_the_loops_callback_is_taken(busy: bool) -> None:
    """Whether the callback runs before the wake-up is cleared (the writer idle) or
    after (busy), what is handed over while it runs is taken without another set."""

    async def main() -> list[int]:
        handover = _Handover(asyncio.get_running_loop(), busy)
        runs = 0

        def during() -> None:
            nonlocal runs
            runs += 1
            if runs == 1:
                handover.hand(2)  # as the writer would, between the drain and the read

        handover.on_drain = during
        try:
            handover.hand(1)
            for _ in range(200):
                if handover.taken == [1, 2]:
                    break
                await asyncio.sleep(0.005)
            return handover.taken
        finally:
            handover.wakeup.close()

    assert uvloop.run(main()) == [1, 2]


@pytest.mark.parametrize("busy", [False, True])
def test_no_hand_over_is_stranded_when_a_thread_races_the_loop(busy: bool) -> None:
    total = 20_000

    async def main() -> list[int]:
        loop = asyncio.get_running_loop()
        handover = _Handover(loop, busy)

        def hand_all() -> None:
            for i in range(total):
                handover.hand(i)

        writer = threading.Thread(target=hand_all)
        try:
            writer.start()
            deadline = time.monotonic() + WAIT_S
            while len(handover.taken) < total and time.monotonic() < deadline:
                await asyncio.sleep(0.001)
            writer.join()
            return handover.taken
        finally:
            handover.wakeup.close()

    assert uvloop.run(main()) == list(range(total))


def test_each_submit_is_written_at_once_and_handed_back_in_order() -> None:
    storage = _storage(wal_idle_roll_ms=60_000)
    batches: queue.Queue[WalBatch] = queue.Queue()
    writer = WalWriter(storage.wal, batches.put)
    writer.start()
    try:
        for k in range(1, 51):
            started = time.monotonic()
            storage.append("q", entries(k, 1))
            batch = batches.get(timeout=WAIT_S)
            # Far below the idle-roll wait (a minute): the submit woke the writer.
            assert time.monotonic() - started < WAIT_S
            assert batch.error is None
            assert storage.complete(batch) == [Persisted("q", k, 1)]
            assert writer.idle
    finally:
        writer.stop()


def test_an_idle_written_file_rolls_and_a_requested_roll_comes_at_once() -> None:
    storage = _storage(wal_idle_roll_ms=50)
    batches: queue.Queue[WalBatch] = queue.Queue()
    writer = WalWriter(storage.wal, batches.put)
    writer.start()
    try:
        storage.append("q", entries(1, 1))
        storage.complete(batches.get(timeout=WAIT_S))
        rolled = batches.get(timeout=WAIT_S)  # after 50 ms with nothing to write
        assert rolled.ops == () and rolled.rolled is not None
    finally:
        writer.stop()
    storage = _storage(wal_idle_roll_ms=60_000)
    writer = WalWriter(storage.wal, batches.put)
    writer.start()
    try:
        storage.append("q", entries(1, 1))
        storage.complete(batches.get(timeout=WAIT_S))
        writer.request_roll()
        assert batches.get(timeout=WAIT_S).rolled is not None
    finally:
        writer.stop()


def test_stop_writes_what_is_pending_first() -> None:
    storage = _storage(wal_idle_roll_ms=60_000)
    batches: list[WalBatch] = []
    writer = WalWriter(storage.wal, batches.append)
    writer.start()
    storage.wal.submit(AppendOp("q", tuple(entries(1, 2))))
    writer.stop()
    assert [op for b in batches for op in b.ops] == [AppendOp("q", tuple(entries(1, 2)))]
    assert not storage.wal.pending() and storage.wal.waker is None
    writer.stop()  # a second stop does nothing


def test_a_held_lone_write_is_written_by_the_caller_and_the_thread_stays_asleep() -> None:
    storage = _storage(wal_idle_roll_ms=60_000)
    batches: queue.Queue[WalBatch] = queue.Queue()
    writer = WalWriter(storage.wal, batches.put)
    writer.start()
    time.sleep(0.2)  # the thread asleep: one woken now would take what is pending itself
    try:
        for k in range(1, 21):
            writer.hold()
            storage.append("q", entries(k, 1))
            assert not writer.idle
            batch = writer.write_now(lambda: True)
            writer.release()
            assert batch is not None and batch.error is None
            assert storage.complete(batch) == [Persisted("q", k, 1)]
            assert writer.idle
        time.sleep(0.05)
        assert batches.empty()  # the thread wrote nothing and handed nothing over
        # Not held: the submit wakes the thread, as before.
        storage.append("q", entries(21, 1))
        assert storage.complete(batches.get(timeout=WAIT_S)) == [Persisted("q", 21, 1)]
    finally:
        writer.stop()


def test_write_now_leaves_a_large_or_out_of_order_batch_to_the_thread() -> None:
    storage = _storage(wal_idle_roll_ms=60_000, wal_batch_bytes_max=1 << 20)
    batches: queue.Queue[WalBatch] = queue.Queue()
    writer = WalWriter(storage.wal, batches.put)
    writer.start()
    time.sleep(0.2)  # the thread asleep: one woken now would take what is pending itself
    try:
        # Held, the thread is not woken: the pending write waits for the release.
        writer.hold()
        storage.append("q", entries(1, 1))
        time.sleep(0.05)
        assert batches.empty() and storage.wal.pending()
        assert writer.write_now(lambda: False) is None  # a batch of the thread waits
        writer.release()
        assert storage.complete(batches.get(timeout=WAIT_S)) == [Persisted("q", 1, 1)]
        # Above LONE_BATCH_BYTES_MAX pending: concurrent writers; the thread writes it.
        writer.hold()
        big = entries(2, 40, size=500)
        assert sum(len(e.data) for e in big) > LONE_BATCH_BYTES_MAX
        storage.append("q", big)
        assert writer.write_now(lambda: True) is None
        writer.release()
        assert storage.complete(batches.get(timeout=WAIT_S)) == [Persisted("q", 41, 1)]
        assert writer.write_now(lambda: True) is None  # nothing pending
    finally:
        writer.stop()


def test_writes_by_the_caller_and_by_the_thread_come_back_in_order_once_each() -> None:
    """The caller (the loop) writes lone appends itself while the thread writes the
    others, racing it: every entry is persisted once, in order, when the caller takes
    the thread's batches in order and writes only with none of them waiting."""
    storage = _storage(wal_idle_roll_ms=60_000, wal_batch_bytes_max=1 << 20)
    handed: deque[WalBatch] = deque()
    writer = WalWriter(storage.wal, handed.append)
    writer.start()
    persisted: list[int] = []
    expected: list[int] = []  # the last index of each append, as its Persisted says
    rng = random.Random(16)

    def take_handed() -> None:
        while handed:
            persisted.extend(e.index for e in storage.complete(handed.popleft()))  # type: ignore[attr-defined]

    try:
        index = 1
        for _ in range(600):
            take_handed()
            if rng.random() < 0.5:
                writer.hold()
                storage.append("q", entries(index, 1))
                expected.append(index)
                batch = writer.write_now(lambda: not handed)
                writer.release()
                if batch is not None:
                    take_handed()  # none can have come in between: write_now checked
                    persisted.extend(e.index for e in storage.complete(batch))  # type: ignore[attr-defined]
                index += 1
            else:
                n = rng.randint(1, 3)
                storage.append("q", entries(index, n))
                index += n
                expected.append(index - 1)
        deadline = time.monotonic() + WAIT_S
        while len(persisted) < len(expected) and time.monotonic() < deadline:
            take_handed()
            time.sleep(0.001)
    finally:
        writer.stop()
    take_handed()
    assert persisted == expected
