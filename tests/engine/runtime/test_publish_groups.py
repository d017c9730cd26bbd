"""Publishes to one queue made in the same turn of the loop, on a real node: they share
entries (engine/runtime/publish_groups.py), and each caller is answered as if alone."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

from engine.errors import QueueFull
from engine.queue import message_id_parts
from engine.runtime import Node
from engine.runtime.api import OutgoingMessage, QueueArgs
from tests.engine.runtime.util import FAST, drain, msgs, run, with_node


def entries_of(ids: list[int]) -> set[int]:
    return {message_id_parts(i)[0] for i in ids}


async def publish_all(node: Node, batches: list[list[OutgoingMessage]]) -> list[object]:
    """Each batch from its own task, all started in the same turn."""
    return await asyncio.gather(*(node.publish("q", b) for b in batches), return_exceptions=True)


def test_concurrent_publishes_share_entries_and_get_their_own_ids(tmp_path: Path) -> None:
    async def body(node: Node) -> None:
        await node.create_queue("q", QueueArgs())
        batches = [msgs(b"m%d" % k) for k in range(20)]
        batches[5] = msgs(b"m5", b"m5b")  # a batch of two keeps its messages together
        batches[7] = msgs(b"m7", dedup_id="k")
        batches[9] = msgs(b"m9", dedup_id="k")  # a duplicate of a message of another call
        answers = await publish_all(node, batches)
        assert all(isinstance(a, list) for a in answers), answers
        ids: list[list[int]] = answers  # type: ignore[assignment]
        assert [len(a) for a in ids] == [len(b) for b in batches]
        assert ids[9] == ids[7]
        flat = [i for a in ids for i in a]
        assert len(set(flat)) == len(flat) - 1
        assert len(entries_of(flat)) < len(batches) / 2
        assert ids[5][1] == ids[5][0] + 1
        expected = [m.body for b in batches for m in b if m.body != b"m9"]
        assert await drain(node, "q") == expected

    run(with_node(tmp_path, body))


def test_a_group_the_queue_cannot_take_answers_each_publish_alone(tmp_path: Path) -> None:
    """Under reject-publish at max_length 3, six publishes of one message made together:
    the first three are taken and the other three refused, as one entry each would be."""

    async def body(node: Node) -> None:
        await node.create_queue("q", QueueArgs(max_length=3))
        answers = await publish_all(node, [msgs(b"m%d" % k) for k in range(6)])
        assert [isinstance(a, list) for a in answers] == [True] * 3 + [False] * 3, answers
        assert all(isinstance(a, QueueFull) for a in answers[3:])
        assert await drain(node, "q") == [b"m0", b"m1", b"m2"]

    run(with_node(tmp_path, body))


def test_drop_head_with_a_limit_and_no_grouping_keep_one_entry_per_publish(
    tmp_path: Path,
) -> None:
    async def body(node: Node, args: QueueArgs) -> list[int]:
        await node.create_queue("q", args)
        answers = await publish_all(node, [msgs(b"m%d" % k) for k in range(10)])
        assert all(isinstance(a, list) for a in answers), answers
        return [a[0] for a in answers]  # type: ignore[index]

    dropping = QueueArgs(max_length=100, overflow="drop-head")
    ids = run(with_node(tmp_path / "a", lambda node: body(node, dropping)))
    assert len(entries_of(ids)) == 10
    alone = dataclasses.replace(FAST, publish_group_messages_max=0)
    ids = run(with_node(tmp_path / "b", lambda node: body(node, QueueArgs()), limits=alone))
    assert len(entries_of(ids)) == 10
