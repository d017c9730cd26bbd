"""Applying: what a node does as each committed entry of a replica applies.

Rule: the driver applies each entry once; here its reply resolves the proposal waiting
on its index (with the proposal's term it succeeded, with another it was lost: the
caller gets ``NoLeader`` and retries) and its effects run. Leader-only effects (wake
long polls, dead-letter) run only on the leader and never during replay, which throws
them away (the machine repeats what must happen: unconfirmed dead letters are emitted
again); checkpoint requests and cursor releases run on every replica.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.errors import NoLeader, QuorraError
from engine.queue import DeadLetter, Expired, MessagesAvailable, PolicyChanged, Rejected
from engine.raft.entry import Entry, EntryKind
from engine.raft.server import Role
from engine.raft.state_machine import CheckpointRequest, MachineEffect, ReleaseCursor
from engine.runtime.checkpoints import Captured
from engine.runtime.replica import Proposal, Replica

if TYPE_CHECKING:
    from engine.runtime.context import NodeContext


class Effects:
    """Resolves a replica's proposals and runs its effects as entries apply."""

    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx

    def applied(self, rep: Replica, e: Entry, reply: object, effects: list[MachineEffect]) -> None:
        rep.bytes_since_capture += len(e.data)
        if effects or rep.bytes_since_capture >= self.ctx.limits.replay_bytes_max:
            # Replay throws leader-only effects away (the machine repeats what must
            # happen: unconfirmed dead letters are emitted again).
            leader = rep.raft.role is Role.LEADER and e.index > rep.driver.replay_until
            self.perform(rep, effects, e, leader)
        if isinstance(reply, PolicyChanged):
            self.ctx.catalog.policy_changed(rep)
        elif isinstance(reply, Expired):
            rep.expire_inflight = False
        self.passed(rep, e, reply)

    def passed(self, rep: Replica, e: Entry, reply: object = None) -> None:
        """The proposal waiting on ``e``, if any, gets its outcome (``reply``: the
        machine's, None for an entry the machine did not apply)."""
        p = rep.waiting.pop(e.index, None)
        if p is not None and not rep.waiting:
            rep.release_waiting()  # an emptied dict keeps its table (160 bytes)
        if p is not None and not p.future.done():
            self.resolve(rep, p, e, reply)

    @staticmethod
    def resolve(rep: Replica, p: Proposal, e: Entry, reply: object) -> None:
        if p.term != e.term or e.kind is not EntryKind.COMMAND:
            p.future.set_exception(NoLeader(f"queue {rep.name}: leadership changed, retry"))
        elif isinstance(reply, Rejected):
            p.future.set_exception(reply.to_error())
        else:
            try:
                p.future.set_result(p.on_applied(reply) if p.on_applied else reply)
            except QuorraError as err:
                p.future.set_exception(err)

    def perform(self, rep: Replica, effects: list[MachineEffect], e: Entry, leader: bool) -> None:
        ctx = self.ctx
        checkpoints = ctx.checkpoints
        checkpoint: Captured | None = None
        for effect in effects:
            if isinstance(effect, MessagesAvailable):
                if leader:
                    rep.available_seq += 1
                    for f in rep.available_waiters:
                        if not f.done():
                            f.set_result(None)
                    rep.available_waiters.clear()
            elif isinstance(effect, DeadLetter):
                if leader:
                    ctx.spawn(ctx.dead_letters.dead_letter(rep, effect))
            elif isinstance(effect, CheckpointRequest):
                checkpoint = checkpoints.capture(rep, effect.index, e.term)
            elif isinstance(effect, ReleaseCursor):
                ctx.spawn(checkpoints.auto_checkpoint(rep, checkpoint, effect.index))
                checkpoint = None
        if checkpoint is None and rep.bytes_since_capture >= ctx.limits.replay_bytes_max:
            # The machine asks for checkpoints when dead entries pile up; a queue whose
            # messages all stay gets one here, so that a restart applies at most this
            # much of the log again whatever the depth of the queue.
            checkpoint = checkpoints.capture(rep, e.index, e.term)
        if checkpoint is not None:
            ctx.spawn(checkpoints.auto_checkpoint(rep, checkpoint, None))


__all__ = ["Effects"]
