"""The writer thread's hand-over of finished WAL batches to the loop: every batch is
taken once, in order, and batches that arrive before a scheduled drain has started share
its wake-up of the loop."""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, cast

from engine.runtime.context import NodeContext
from engine.runtime.hosting import Hosting
from engine.storage import WalBatch


class CountingLoop:
    """Records what ``call_soon_threadsafe`` schedules; the test runs it."""

    def __init__(self) -> None:
        self.scheduled: list[Callable[[], None]] = []

    def call_soon_threadsafe(self, fn: Callable[[], None]) -> None:
        self.scheduled.append(fn)


def _batch(seq: int) -> WalBatch:
    return WalBatch((), None, None, 0, seq)


def _hosting() -> tuple[Hosting, CountingLoop, list[int]]:
    loop = CountingLoop()
    hosting = Hosting(cast(NodeContext, SimpleNamespace(loop=loop, trace=None)))
    taken: list[int] = []

    def on_wal_batch(batch: WalBatch) -> None:
        taken.append(batch.wal_seq)

    cast(Any, hosting).on_wal_batch = on_wal_batch
    return hosting, loop, taken


def test_batches_before_the_drain_share_one_wake_up_and_later_ones_get_another() -> None:
    hosting, loop, taken = _hosting()
    for seq in (1, 2, 3):
        hosting.on_wal_batch_threadsafe(_batch(seq))
    assert len(loop.scheduled) == 1
    loop.scheduled.pop()()
    assert taken == [1, 2, 3]
    hosting.on_wal_batch_threadsafe(_batch(4))
    assert len(loop.scheduled) == 1
    loop.scheduled.pop()()
    assert taken == [1, 2, 3, 4]


def test_no_batch_is_stranded_when_the_writer_races_the_drain() -> None:
    hosting, loop, taken = _hosting()
    total = 20_000
    done = threading.Event()

    def writer() -> None:
        for seq in range(total):
            hosting.on_wal_batch_threadsafe(_batch(seq))
        done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    while not done.is_set() or loop.scheduled:
        if loop.scheduled:
            loop.scheduled.pop(0)()
    thread.join()
    assert taken == list(range(total))
    assert not hosting.batches and not hosting.drain_scheduled
