"""A stop waits for the storage work under way: workers end before storage closes."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from pathlib import Path

import pytest

from engine.errors import NoLeader, QuorraError
from engine.runtime import catalog, meta
from engine.runtime import node as node_module
from engine.storage import Checkpoint, Disk, NodeStorage
from engine.storage.checkpoint import CheckpointStore
from tests.engine.runtime.util import DEFAULT_ARGS, msgs, run, started


@pytest.mark.parametrize("how", ["stop", "halt"])
def test_storage_closes_only_after_a_checkpoint_write_in_flight_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    entered, release = threading.Event(), threading.Event()
    events: list[str] = []
    write, close, close_files = CheckpointStore.write, NodeStorage.close, node_module._close_files

    def slow_write(store: CheckpointStore, cp: Checkpoint) -> int:
        entered.set()
        release.wait(10)
        size = write(store, cp)
        events.append("written")
        return size

    def recorded_close(storage: NodeStorage, *, flush: bool = True) -> None:
        events.append("closed")
        close(storage, flush=flush)

    def recorded_close_files(storage: NodeStorage) -> None:
        events.append("closed")
        close_files(storage)

    monkeypatch.setattr(CheckpointStore, "write", slow_write)
    monkeypatch.setattr(NodeStorage, "close", recorded_close)
    monkeypatch.setattr(node_module, "_close_files", recorded_close_files)

    async def body() -> None:
        node = await started(tmp_path)
        await node.create_queue("q", DEFAULT_ARGS)
        await node.publish("q", msgs("a"))
        checkpoint = asyncio.create_task(node.checkpoint("q"))
        assert await asyncio.to_thread(entered.wait, 10)
        stopping = asyncio.create_task(node.stop() if how == "stop" else node.halt())
        await asyncio.sleep(0.3)
        assert events == [], "storage closed under a checkpoint write"
        release.set()
        await stopping
        assert events == ["written", "closed"]
        with contextlib.suppress(QuorraError):
            await checkpoint

    run(body())


def test_a_graceful_stop_waits_for_admin_calls_in_flight_and_refuses_new_ones(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        node = await started(tmp_path)
        await node.create_queue("q", DEFAULT_ARGS)
        await node.publish("q", msgs("a"))
        update = asyncio.create_task(node.update_policy("q", {"max_length": 7}))
        checkpoint = asyncio.create_task(node.checkpoint("q"))
        compact = asyncio.create_task(node.compact("q"))
        await asyncio.sleep(0)  # each is in flight, waiting for its proposal or its worker
        stopping = asyncio.create_task(node.stop())
        await asyncio.sleep(0)  # the stop waits for them
        with pytest.raises(NoLeader):
            await node.update_policy("q", {"max_length": 8})
        with pytest.raises(NoLeader):
            await node.checkpoint("q")
        with pytest.raises(NoLeader):
            await node.compact("q")
        await stopping
        assert (await update).args.max_length == 7
        assert (await checkpoint).index >= 2
        await compact
        node = await started(tmp_path)
        try:
            assert [q.args.max_length for q in node.queues()] == [7]
        finally:
            await node.stop()

    run(body())


def test_definitions_are_written_off_the_loop_and_a_deletion_stays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[threading.Thread] = []
    write = meta.write_meta

    def recorded(disk: Disk, queue: meta.QueueMeta) -> None:
        threads.append(threading.current_thread())
        write(disk, queue)

    monkeypatch.setattr(catalog, "write_meta", recorded)

    async def body() -> None:
        node = await started(tmp_path)
        try:
            await node.create_queue("q", DEFAULT_ARGS)
            await node.create_queue("gone", DEFAULT_ARGS)
            await node.update_policy("q", {"max_length": 7})
            await node.update_policy("gone", {"max_length": 7})
            await node.delete_queue("gone")
        finally:
            await node.stop()
        assert threads and threading.main_thread() not in threads  # the loop's thread
        node = await started(tmp_path)
        try:
            assert [(q.name, q.args.max_length) for q in node.queues()] == [("q", 7)]
        finally:
            await node.stop()

    run(body())
