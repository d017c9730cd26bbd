"""A lone publish to a one-member queue on an idle WAL is synced by the loop itself, not
handed to the writer thread and back; concurrent publishes still go to the thread and
share its syncs (group commit). Either way a publish returns only after its sync."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from engine.runtime import Node
from engine.runtime.api import QueueArgs
from tests.engine.runtime.util import drain, msgs, run, started


class _Syncs:
    """Records the thread of each ``os.fdatasync``, and the publishes returned by then."""

    def __init__(self) -> None:
        self.threads: list[str] = []
        self.returned = 0
        self.returned_at_sync: list[int] = []
        self._real = os.fdatasync

    def __call__(self, fd: int) -> None:
        self._real(fd)
        self.threads.append(threading.current_thread().name)
        self.returned_at_sync.append(self.returned)


@pytest.fixture
def syncs(monkeypatch: pytest.MonkeyPatch) -> _Syncs:
    recorder = _Syncs()
    monkeypatch.setattr(os, "fdatasync", recorder)
    return recorder


async def _node(tmp_path: Path) -> Node:
    node = await started(tmp_path)
    await node.create_queue("q", QueueArgs())
    await node.publish("q", msgs("warm"))
    await asyncio.sleep(0.05)  # the writer thread asleep again
    return node


def test_a_lone_publish_is_synced_on_the_loop(tmp_path: Path, syncs: _Syncs) -> None:
    async def main() -> list[bytes]:
        node = await _node(tmp_path)
        try:
            loop_thread = threading.current_thread().name
            for k in range(20):
                before = len(syncs.threads)
                await node.publish("q", msgs(f"m{k}"))
                syncs.returned += 1
                # Synced before it returned, by the loop's own thread.
                assert loop_thread in syncs.threads[before:]
                assert syncs.returned_at_sync[-1] == syncs.returned - 1
            return await drain(node, "q")
        finally:
            await node.stop()

    assert run(main()) == [b"warm"] + [f"m{k}".encode() for k in range(20)]


def test_concurrent_publishes_share_the_writer_threads_syncs(tmp_path: Path, syncs: _Syncs) -> None:
    async def main() -> list[bytes]:
        node = await _node(tmp_path)
        try:
            before = len(syncs.threads)
            await asyncio.gather(*(node.publish("q", msgs(f"m{k}")) for k in range(50)))
            during = syncs.threads[before:]
            assert "quorra-wal" in during
            assert len(during) < 25  # grouped, not one sync each
            return sorted(await drain(node, "q"))
        finally:
            await node.stop()

    assert run(main()) == sorted([b"warm"] + [f"m{k}".encode() for k in range(50)])
