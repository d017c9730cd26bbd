"""A publish that finds the WAL idle is processed without the replica's tail, which
the write's completion runs: what the tail does after a publish still happens."""

from __future__ import annotations

from pathlib import Path

from engine.runtime.api import OutgoingMessage, QueueArgs
from tests.engine.runtime.util import eventually, run, started


def test_a_lone_publish_arms_the_expiry_timer_of_an_idle_queue(tmp_path: Path) -> None:
    """Nothing but the expiry timer expires a message of an idle queue: it is armed
    once the publish's entry is durable and applied."""

    async def body() -> None:
        node = await started(tmp_path)
        try:
            await node.create_queue("t", QueueArgs())
            for k in range(3):
                await node.publish("t", [OutgoingMessage(b"short", ttl_ms=30)])
                await eventually(
                    lambda k=k: node.stats("t")["expired"] == k + 1,  # type: ignore[misc]
                    what="the message expired on an idle queue",
                )
            assert node.stats("t")["messages_ready"] == 0
        finally:
            await node.stop()

    run(body())
