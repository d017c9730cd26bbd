"""A restart costs the same whatever the depth of the queue: nothing proportional to the
queued messages runs on the event loop at start or before the first receive. The
checkpoint's size is the one its file has (not learnt by encoding it again), and the
live set behind stats is seeded from the checkpoint and rebuilt on a worker thread."""

from __future__ import annotations

from pathlib import Path

import pytest

import engine.runtime.node as node_module
import engine.storage.checkpoint as checkpoint_module
from engine.runtime.api import QueueArgs
from tests.runtime.util import drain, msgs, run, started


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
        monkeypatch.setattr(node_module, "encode_checkpoint", refused, raising=False)
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
