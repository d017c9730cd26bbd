"""A restart costs the same whatever the depth of the queue: nothing proportional to the
queued messages runs on the event loop at start or before the first receive. The
checkpoint's size is the one its file has (not learnt by encoding it again), and the
live set behind stats is seeded from the checkpoint and rebuilt on a worker thread."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from pyroaring import BitMap64

import engine.runtime.checkpoints as checkpoints_module
import engine.storage.checkpoint as checkpoint_module
from app.ui.reads import EngineReads
from app.ui.series import SeriesStore, sample_round
from engine.queue import QueueMachine
from engine.queue.snapshots import FrozenMachine
from engine.runtime import Node, observe
from engine.runtime.api import QueueArgs
from tests.engine.runtime.util import drain, eventually, msgs, run, started


def test_a_restart_knows_the_checkpoint_size_without_encoding_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def body() -> None:
        node = await started(tmp_path)
        await node.create_queue("q", QueueArgs())
        await node.publish("q", msgs(*[f"m{i}" for i in range(100)]))
        record = await node.checkpoint("q")
        await node.stop()
        files = list(tmp_path.glob("queues/*/checkpoints/*.chk"))
        assert record.bytes in {f.stat().st_size for f in files}

        def refused(*_args: object) -> bytes:
            raise AssertionError("a checkpoint was encoded at start")

        monkeypatch.setattr(checkpoint_module, "encode_checkpoint", refused)
        monkeypatch.setattr(checkpoints_module, "encode_checkpoint", refused, raising=False)
        node = await started(tmp_path)
        try:
            stats = node.stats("q")["checkpoint"]
            assert isinstance(stats, dict)
            newest = max(files, key=lambda f: int(f.stem))
            assert stats["bytes"] == newest.stat().st_size > 0
            assert len(await drain(node, "q")) == 100
        finally:
            monkeypatch.undo()
            await node.stop()

    run(body())


DEEP = 100_000
"""Messages of a queue deep enough that its live set is never built on the event loop
(``observe.LIVE_SET_INLINE_MAX``), published in batches of 1,000: one entry each."""


def _live_entries_bounded(log: object, holding: int) -> None:
    """``holding`` entries hold messages: never fewer count as live, and no more than
    those applied since the set was built besides."""
    assert isinstance(log, dict)
    since = log["last_index"] - log["live_set_index"]
    assert holding <= log["live_entries"] <= holding + since


def _count_live_builds(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Every live-set build from now on, as whether it ran on the caller's (loop) thread."""
    on_loop: list[bool] = []
    main = threading.main_thread()
    build_live, build_frozen = QueueMachine.live_indexes, FrozenMachine.live_indexes

    def machine_live(self: QueueMachine) -> BitMap64:
        on_loop.append(threading.current_thread() is main)
        return build_live(self)

    def frozen_live(self: FrozenMachine) -> BitMap64:
        on_loop.append(threading.current_thread() is main)
        return build_frozen(self)

    monkeypatch.setattr(QueueMachine, "live_indexes", machine_live)
    monkeypatch.setattr(FrozenMachine, "live_indexes", frozen_live)
    return on_loop


async def _fill(node: Node, name: str, messages: int) -> None:
    batch = 1000
    for k in range(0, messages, batch):
        await node.publish(name, msgs(*[f"{k + i}" for i in range(batch)]))


def test_a_restarted_deep_queue_answers_a_receive_and_stats_without_walking_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dashboard's sampler reads stats right at start; neither they nor the first
    receive wait for a live set, which the checkpoint's set stands for meanwhile."""

    async def body() -> None:
        node = await started(tmp_path)
        await node.create_queue("deep", QueueArgs())
        await _fill(node, "deep", DEEP)
        await node.checkpoint("deep")
        await node.publish("deep", msgs("after the checkpoint"))
        await node.stop()
        builds = _count_live_builds(monkeypatch)
        node = await started(tmp_path)
        try:
            stats = node.stats("deep")
            got = await node.receive("deep", consumer="c", max_messages=1, wait_ms=0, lease_ms=None)
            assert [m.body for m in got] == [b"0"]
            assert builds == [], "no live set was built before the first receive"
            log = node.stats("deep")["log"]
            assert isinstance(log, dict) and log["live_set_index"] > 0
            assert got[0].id >> 10 in observe.live_indexes(node.context.replica("deep"))
            _live_entries_bounded(log, DEEP // 1000 + 1)
            assert stats["messages_ready"] == DEEP + 1
        finally:
            await node.stop()

    run(body())


def test_the_stats_of_a_deep_queue_never_build_its_live_set_on_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A queue with no checkpoint yet: the sampler's stats count every entry as live
    until the set built on a worker is done, and never an entry holding a message as dead."""

    async def body() -> None:
        node = await started(tmp_path)
        try:
            await node.create_queue("deep", QueueArgs())
            await _fill(node, "deep", DEEP)
            builds = _count_live_builds(monkeypatch)
            store = SeriesStore()
            await sample_round(node, store, EngineReads())
            last = node.stats("deep")["log"]
            assert isinstance(last, dict) and last["live_entries"] == last["last_index"]
            build = node.context.replica("deep").live_build
            assert build is not None, "a build runs on a worker"
            await eventually(build[2].done)
            await node.publish("deep", msgs("late"))
            got = await node.receive("deep", consumer="c", max_messages=1, wait_ms=0, lease_ms=None)
            log = node.stats("deep")["log"]
            assert isinstance(log, dict) and log["live_set_index"] > 0
            _live_entries_bounded(log, DEEP // 1000 + 1)
            assert got[0].id >> 10 in observe.live_indexes(node.context.replica("deep"))
            assert builds == [False], "one build, on a worker"
        finally:
            await node.stop()

    run(body())
