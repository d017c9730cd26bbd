"""A queue's checkpoint and compaction history, asked on a node without a replica of it.

Rule: a node keeps the history of the runs of its own replicas (and of those other nodes
asked its replicas for) in its SQLite, which the app writes (its record listener); a node
that holds no replica of a queue has none of it. So its API and dashboard ask the
queue's leader's node (``HistoryCall``, forwarded as a client operation is), which reads
its SQLite through the app's ``HistorySource``. The answer is bounded by
``Limits.history_records_max`` runs of each kind, and the whole question (the leader's
look-up included) by ``Limits.leader_history_deadline_ms``: when no leader answers in
time, the status is ``absent`` with why, and the caller shows the runs it keeps itself.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from engine.errors import QueueNotFound, QuorraError
from engine.runtime.api import LeaderHistory, QueueHistory
from engine.runtime.routing import HistoryCall

if TYPE_CHECKING:
    from engine.runtime.context import NodeContext

NO_HISTORY = QueueHistory([], [])


async def leader_history(ctx: NodeContext, name: str) -> LeaderHistory:
    """The history of remote queue ``name`` on its leader's node (see the module's rule);
    ``QueueNotFound`` if no such queue is served here."""
    forwarder = ctx.forwarder
    forwarder.record(name)
    deadline_ms = ctx.limits.leader_history_deadline_ms
    try:
        answer = await asyncio.wait_for(forwarder.forward(HistoryCall(name)), deadline_ms / 1000)
    except TimeoutError:
        return _absent(ctx, name, f"its leader did not answer within {deadline_ms} ms")
    except QueueNotFound:
        raise
    except QuorraError as e:
        return _absent(ctx, name, e.detail)
    if not isinstance(answer, QueueHistory):  # peer bytes: checked, not asserted
        return _absent(ctx, name, "its leader sent no history")
    limit = ctx.limits.history_records_max
    bounded = QueueHistory(answer.snapshots[:limit], answer.compactions[:limit])
    return LeaderHistory("ok", forwarder.leaders.get(name), bounded)


def _absent(ctx: NodeContext, name: str, why: str) -> LeaderHistory:
    leader = ctx.forwarder.leaders.get(name)
    return LeaderHistory("absent", leader, NO_HISTORY, f"queue {name}: {why}")


__all__ = ["NO_HISTORY", "leader_history"]
