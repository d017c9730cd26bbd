"""A stop waits for the storage work under way: workers end before storage closes."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from pathlib import Path

import pytest

from engine.errors import QuorraError
from engine.runtime import Node
from engine.storage import Checkpoint, NodeStorage
from engine.storage.checkpoint import CheckpointStore
from tests.runtime.util import DEFAULT_ARGS, msgs, run, started


@pytest.mark.parametrize("how", ["stop", "halt"])
def test_storage_closes_only_after_a_checkpoint_write_in_flight_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    entered, release = threading.Event(), threading.Event()
    events: list[str] = []
    write, close, close_files = CheckpointStore.write, NodeStorage.close, Node._close_files

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
    monkeypatch.setattr(Node, "_close_files", staticmethod(recorded_close_files))

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
