"""Helpers of the runtime tests: run a coroutine with a deadline, poll for a condition."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from engine.limits import DEFAULT_LIMITS, Limits
from engine.runtime import Node
from engine.runtime.api import CheckpointRecord, CompactionRecord, OutgoingMessage, QueueArgs

T = TypeVar("T")

FAST = dataclasses.replace(
    DEFAULT_LIMITS,
    election_timeout_ms_min=150,
    election_timeout_ms_max=300,
    heartbeat_interval_ms=30,
    leader_wait_ms=3000,
)


def run(coro: Coroutine[Any, Any, T], timeout_s: float = 60) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(coro, timeout_s)

    return asyncio.run(bounded())


async def eventually(check: Callable[[], bool], timeout_s: float = 10, what: str = "") -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what or check}")
        await asyncio.sleep(0.02)


async def started(data_dir: Path, limits: Limits = FAST, **kw: Any) -> Node:
    node = Node(data_dir, limits=limits, **kw)
    await node.start()
    return node


async def started_recording(
    data_dir: Path, limits: Limits = FAST
) -> tuple[Node, list[CheckpointRecord | CompactionRecord]]:
    """A started node and the list its checkpoint and compaction records go to."""
    records: list[CheckpointRecord | CompactionRecord] = []

    async def listener(record: CheckpointRecord | CompactionRecord) -> None:
        records.append(record)

    node = await started(data_dir, limits)
    node.set_record_listener(listener)
    return node, records


def msgs(*bodies: bytes | str, **kw: Any) -> list[OutgoingMessage]:
    return [OutgoingMessage(b if isinstance(b, bytes) else b.encode(), **kw) for b in bodies]


async def drain(node: Node, name: str, max_messages: int = 1000) -> list[bytes]:
    """Receive and ack until the queue returns nothing; the bodies in delivery order."""
    out: list[bytes] = []
    while True:
        got = await node.receive(
            name, consumer="drain", max_messages=max_messages, wait_ms=0, lease_ms=None
        )
        if not got:
            return out
        out += [m.body for m in got]
        await node.ack(name, [m.receipt for m in got])


async def with_node(data_dir: Path, body: Callable[[Node], Awaitable[T]], **kw: Any) -> T:
    node = await started(data_dir, **kw)
    try:
        return await body(node)
    finally:
        await node.stop()


DEFAULT_ARGS = QueueArgs()


def rolling(**change: int) -> Limits:
    """FAST with a small WAL file, so that a test rolls it and writes segments."""
    mib = 1024 * 1024
    base = {
        "wal_file_bytes_max": mib,
        "wal_batch_bytes_max": mib,
        "entry_bytes_max": mib,
        "batch_bytes_max": mib,
        "message_bytes_max": mib,
        "message_bytes_max_ceiling": mib,
    }
    base.update(change)
    return dataclasses.replace(FAST, **base)
