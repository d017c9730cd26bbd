"""Publish groups: the publishes to one queue that arrive in the same turn of the loop,
proposed as one enqueue entry.

Under load most requests publish one message each, and each proposal costs a Raft
entry, a WAL record, an apply and the bookkeeping around them: more than the message.
A publish that would wait for the next WAL batch anyway (its queue's work is already
scheduled for the next turn, or the writer is busy) joins the queue's open group
instead of proposing; the group is proposed at the next turn of the loop as one entry:
the parts' messages in the order the parts joined, each part's own messages together
and in their order. Each caller is answered with its own ids, once that entry applied
(durable on a quorum), as if alone. A publish to an idle writer goes alone, at once:
grouping never adds a wait to a lone publish.

What must not change:

* each part is checked as it would be alone before it joins (its sizes, the queue's
  publish bytes in flight, the node's memory), by ``QueueOps.publish_local``;
* dedup ids are matched within an entry as across entries (the machine marks a repeat
  of an earlier message of the same batch, ``engine.queue.dedup``), so a group finds the
  same duplicates as its parts proposed one after another;
* a batch is all or nothing for its own caller only. The machine rejects an entry whole
  (the queue full under ``reject-publish``, a message over a ``max_message_bytes``
  lowered since it was checked), so a rejected group is proposed again part by part,
  each caller answered by its own entry. An entry lost (a change of leader, a failed
  disk) fails every part, as it fails every proposal of a WAL batch;
* what the queue drops: under ``drop-head`` with a length or byte limit the machine
  drops after each entry, from the lowest priority's head, until the queue fits, and
  one entry of two batches may drop another message than the two entries (the first
  batch's message of a higher priority rather than the second's of a lower): such a
  queue's publishes are never grouped (``groupable``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.errors import MessageTooLarge, NoLeader, QueueFull
from engine.queue import (
    OVERFLOW_DROP_HEAD,
    Enqueued,
    KeyedBody,
    NewMessage,
    QueuePolicy,
    encode_enqueue,
)

if TYPE_CHECKING:
    from engine.runtime.context import NodeContext
    from engine.runtime.replica import Replica

Item = NewMessage | bytes | KeyedBody


@dataclass(slots=True)
class Part:
    """One caller's batch in a group: ``messages[start : start + count]``."""

    start: int
    count: int
    future: asyncio.Future[list[int]]


@dataclass(slots=True)
class PublishGroup:
    messages: list[Item] = field(default_factory=list)
    parts: list[Part] = field(default_factory=list)
    bytes: int = 0
    """The parts' entries' lengths, summed (the group's entry is a little shorter)."""


class PublishGroups:
    """A node's open publish groups (one per queue at most: ``Replica.publish_group``)."""

    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx

    def may_join(self, rep: Replica, count: int) -> bool:
        """Whether a batch of ``count`` messages would join a group (its byte size is
        asked by ``join``): a group is open, or the queue's next entry waits anyway."""
        limits = self.ctx.limits
        most = min(limits.publish_group_messages_max, limits.batch_messages_max)
        group = rep.publish_group
        if group is not None:
            return len(group.messages) + count <= most
        if count >= most or not groupable(rep.machine.policy):
            return False
        writer = self.ctx.writer
        return rep.scheduled or writer is None or not writer.idle

    def join(self, rep: Replica, batch: list[Item], size: int) -> asyncio.Future[list[int]] | None:
        """The future of ``batch``'s ids once its group applied, or None when its
        bytes do not fit (the caller proposes it alone)."""
        group = rep.publish_group
        if group is None:
            group = rep.publish_group = PublishGroup()
            self.ctx.spawn(self._propose(rep, group))
        elif group.bytes + size > self.ctx.limits.batch_bytes_max:
            return None
        future: asyncio.Future[list[int]] = self.ctx.loop.create_future()
        group.parts.append(Part(len(group.messages), len(batch), future))
        group.messages += batch
        group.bytes += size
        return future

    async def _propose(self, rep: Replica, group: PublishGroup) -> None:
        """At the next turn: close the group, propose its entry, answer its parts."""
        if rep.publish_group is group:
            rep.publish_group = None
        parts = group.parts
        try:
            reply = await self.ctx.propose(rep, encode_enqueue(group.messages))
        except (QueueFull, MessageTooLarge) as e:
            if len(parts) == 1:
                _fail(parts, e)
            else:  # rejected whole, nothing applied: each part on its own
                await asyncio.gather(*(self._alone(rep, group, part) for part in parts))
            return
        except Exception as e:
            _fail(parts, e)
            return
        else:
            assert isinstance(reply, Enqueued), reply
            ids = reply.ids
            for part in parts:
                if not part.future.done():
                    part.future.set_result(list(ids[part.start : part.start + part.count]))
        finally:  # a part still waiting here: the node stops (this task is cancelled)
            _fail(parts, rep.close_error or NoLeader(f"queue {rep.name}: the node stops"))

    async def _alone(self, rep: Replica, group: PublishGroup, part: Part) -> None:
        command = encode_enqueue(group.messages[part.start : part.start + part.count])
        try:
            reply = await self.ctx.propose(rep, command)
        except Exception as e:
            _fail([part], e)
            return
        assert isinstance(reply, Enqueued), reply
        if not part.future.done():
            part.future.set_result(list(reply.ids))


def groupable(policy: QueuePolicy) -> bool:
    """Whether publishes to a queue of ``policy`` may be grouped: one entry of several
    batches then leaves the queue as the batches' entries one after another would."""
    limited = policy.max_length is not None or policy.max_bytes is not None
    return not (limited and policy.overflow == OVERFLOW_DROP_HEAD)


def _fail(parts: list[Part], error: BaseException) -> None:
    for part in parts:
        if not part.future.done():
            part.future.set_exception(error)


__all__ = ["PublishGroup", "PublishGroups", "groupable"]
