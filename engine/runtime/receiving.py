"""What a node takes from its peers' Raft messages, and what it refuses.

Rule: a Raft message from node ``src`` for group ``uid`` reaches a replica only if this
node hosts ``uid``, the message says it comes from ``src``'s member of the group
(``"<src>/<uid>"``: a peer cannot speak for another node, nor for another group) and it is
addressed to this node's member. The replica's core then refuses what no correct peer
sends (``engine.raft.refusals``). Every refusal is dropped and counted by reason
(``Node.cluster()["refused_from_peers"]``); they are logged at most once per
``Limits.peer_refusal_log_interval_ms``, as one line that sums up the interval, so that a
peer sending junk cannot flood the log. A message for a group this node does not host is
common and harmless (a queue deleted here, or a replica not created yet): it is counted
but not logged.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from engine.ids import NodeName
from engine.raft.events import Receive
from engine.raft.messages import Message
from engine.raft.server import RaftServer
from engine.runtime.replica import Replica, server_id

if TYPE_CHECKING:
    from engine.runtime.context import NodeContext

log = logging.getLogger("quorra.engine")

NOT_HOSTED = "group_not_hosted"


class Receiving:
    """A node's checks on the Raft messages of its peers, and its count of refusals."""

    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx
        self.refused: dict[str, int] = {}
        """Refused messages by reason, since the node started."""
        self._unlogged: dict[str, int] = {}
        """Refusals since the last log line, by reason."""
        self._logged_ms: int | None = None

    def replica_for(self, src: NodeName, uid: str, message: Message) -> Replica | None:
        """The replica ``message`` is for, or ``None`` (refused, counted)."""
        rep = self.ctx.by_uid.get(uid)
        if rep is None:
            self.refuse(NOT_HOSTED, src, message)
        elif message.src != server_id(src, uid):
            self.refuse("sender_not_the_peer", src, message)
        elif message.dst != rep.server_id:
            self.refuse("not_addressed_here", src, message)
        else:
            return rep
        return None

    def step(self, rep: Replica, src: NodeName, message: Message) -> None:
        """Step ``message`` into the replica's core; count it if the core refuses it."""
        self.step_core(rep.raft, src, message)

    def step_core(self, raft: RaftServer, src: NodeName, message: Message) -> None:
        """Step ``message`` into ``raft`` (a queue's or the metadata's core); count it if
        the core refuses it."""
        refused = raft.refused
        raft.step(Receive(message))
        if raft.refused != refused and raft.refusal is not None:
            self.refuse(raft.refusal, src, message)

    def refuse(self, reason: str, src: NodeName, message: Message) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1
        if reason == NOT_HOSTED:
            return
        self._unlogged[reason] = self._unlogged.get(reason, 0) + 1
        now_ms = self.ctx.clock.monotonic_ms()
        interval_ms = self.ctx.limits.peer_refusal_log_interval_ms
        if self._logged_ms is not None and now_ms - self._logged_ms < interval_ms:
            return
        counts = ", ".join(f"{r}: {n}" for r, n in sorted(self._unlogged.items()))
        log.warning(
            "refused %d message(s) from peers (%s); the last: %s from %s (%s)",
            sum(self._unlogged.values()),
            counts,
            type(message).__name__,
            src,
            reason,
        )
        self._unlogged = {}
        self._logged_ms = now_ms


__all__ = ["Receiving"]
