"""Dead-lettering: the leader's copies of dead messages to the dead-letter queue.

Rule: the machine emits a ``DeadLetter`` effect; only the leader performs it (replay and
followers drop it, and the machine emits unconfirmed ones again). The copies are
published to the target first, on this node or through a peer that hosts it, each with
a dedup id derived from the source message so that a repeat is harmless; the source
then confirms them (``encode_dead_letter_confirm``). A target that exists nowhere in the
cluster drops them (the machine's rule). A failure postpones the copies: the machine
emits them again.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from engine.errors import QueueNotFound, QuorraError
from engine.queue import DeadLetter, encode_dead_letter_confirm, message_id, read_message
from engine.queue.commands import DEAD_LETTER_CONFIRM_REFS_MAX
from engine.runtime.api import OutgoingMessage
from engine.runtime.meta import decode_headers
from engine.runtime.replica import Replica
from engine.runtime.routing import PublishRouted

if TYPE_CHECKING:
    from engine.runtime.context import NodeContext

log = logging.getLogger("quorra.engine")


class DeadLetters:
    """Performs a leader's ``DeadLetter`` effects."""

    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx

    async def dead_letter(self, rep: Replica, effect: DeadLetter) -> None:
        """Publish copies to the target (dedup ids make a repeat harmless), then confirm.
        A target that exists nowhere in the cluster drops them (the machine's rule)."""
        try:
            copies = self.copies(rep, effect)
            if effect.target != rep.name:
                for batch in self.batches_of(copies):
                    if not await self.publish_anywhere(effect.target, batch):
                        break
            refs = list(effect.refs)
            step = DEAD_LETTER_CONFIRM_REFS_MAX
            for k in range(0, len(refs), step):
                await self.ctx.propose(rep, encode_dead_letter_confirm(refs[k : k + step]))
        except QuorraError as e:
            log.warning("queue %s: dead-lettering to %s postponed: %s", rep.name, effect.target, e)

    async def publish_anywhere(self, name: str, batch: list[OutgoingMessage]) -> bool:
        """Publish to ``name`` here, or through a peer that hosts it; False if no node
        has such a queue."""
        ctx = self.ctx
        if name in ctx.replicas:
            await ctx.ops.publish(name, batch)
            return True
        for peer in ctx.transport.nodes():
            if peer != ctx.name:
                try:
                    await ctx.transport.call(peer, PublishRouted(name, batch))
                    return True
                except QueueNotFound:
                    continue
        return False

    def batches_of(self, copies: list[OutgoingMessage]) -> list[list[OutgoingMessage]]:
        """Copies in publish batches within the batch limits (count and bytes)."""
        limits = self.ctx.limits
        budget = limits.dead_letter_batch_bytes_max
        out: list[list[OutgoingMessage]] = []
        size = 0
        for m in copies:
            weight = len(m.body) + limits.message_overhead_bytes
            if not out or len(out[-1]) >= limits.batch_messages_max or size + weight > budget:
                out.append([])
                size = 0
            out[-1].append(m)
            size += weight
        return out

    def copies(self, rep: Replica, effect: DeadLetter) -> list[OutgoingMessage]:
        copies = []
        entry_at = self.ctx.ops.entry
        for ref, count in zip(effect.refs, effect.delivery_counts, strict=True):
            parts = rep.machine.ref_parts(ref)
            index, slot = parts.index, parts.slot
            view = read_message(entry_at(rep, index).data, slot)
            headers = decode_headers(view.headers)
            headers.update(
                {
                    "x-death-reason": effect.reason,
                    "x-death-queue": rep.name,
                    "x-delivery-count": str(count),
                }
            )
            copies.append(
                OutgoingMessage(
                    body=bytes(view.body),
                    headers=headers,
                    priority=view.priority,
                    dedup_id=f"dlx:{rep.uid}:{message_id(index, slot)}",
                )
            )
        return copies


__all__ = ["DeadLetters"]
