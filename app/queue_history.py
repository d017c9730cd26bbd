"""A queue's snapshot and compaction history, for the API and the dashboard.

A node keeps in its SQLite the runs of its own replicas (automatic ones through its
record listener, manual ones asked through it or by a peer of its replica). A cluster
node without a replica of the queue asks its leader's node, which answers from its
SQLite through ``history_source`` (``engine.runtime.leader_history``); if that node does
not answer in time, it shows the runs it keeps itself (those asked through it), marked
``absent``. What is shown says whose runs they are: ``source`` is ``local`` (this node's
replica), ``leader`` (the leader's node's, ``from_node``) or ``absent``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fastapi import Response
from sqlalchemy.orm import Session

from app.db import repo
from app.db.session import Database
from engine.runtime.api import HistorySource, QueueEngine, QueueHistory

HistoryShown = Literal["local", "leader", "absent"]
HISTORY_SOURCE_HEADER = "Quorra-History"
HISTORY_NODE_HEADER = "Quorra-History-Node"
HISTORY_HEADERS_DOC = {
    HISTORY_SOURCE_HEADER: {
        "description": "Whose runs the answer lists: `local` (this node's replica of the "
        "queue), `leader` (a node without a replica asked the queue's leader's node), or "
        "`absent` (it asked, and no leader answered in time: the runs made through this "
        "node only).",
        "schema": {"type": "string", "enum": ["local", "leader", "absent"]},
    },
    HISTORY_NODE_HEADER: {
        "description": "The node that keeps the runs listed.",
        "schema": {"type": "string"},
    },
}


@dataclass(frozen=True, slots=True)
class History:
    source: HistoryShown
    node: str
    """The node whose SQLite holds the runs shown."""
    detail: str
    """Why the leader's runs are absent ("" otherwise)."""
    snapshots: list[repo.SnapshotFacts]
    compactions: list[repo.CompactionFacts]

    def mark(self, response: Response) -> None:
        response.headers[HISTORY_SOURCE_HEADER] = self.source
        response.headers[HISTORY_NODE_HEADER] = self.node


def history_source(db: Database) -> HistorySource:
    """What a node answers a peer's ``HistoryCall`` with: its SQLite's runs of the
    queue's incarnation ``uid``, newest first."""

    async def source(name: str, uid: str, limit: int) -> QueueHistory:
        def read(session: Session) -> QueueHistory:
            snapshots = repo.list_snapshots(session, uid, limit)
            compactions = repo.list_compactions(session, uid, limit)
            return QueueHistory(
                [repo.snapshot_record(name, row) for row in snapshots],
                [repo.compaction_record(name, row) for row in compactions],
            )

        return await db.run(read)

    return source


def _local(
    session: Session, name: str, engine_uid: str, limit: int
) -> tuple[list[repo.SnapshotFacts], list[repo.CompactionFacts]]:
    row = repo.get_queue(session, name)
    uid = row.uid if row is not None else engine_uid
    return (
        [
            repo.snapshot_facts(repo.snapshot_record(name, r))
            for r in repo.list_snapshots(session, uid, limit)
        ],
        [
            repo.compaction_facts(repo.compaction_record(name, r))
            for r in repo.list_compactions(session, uid, limit)
        ],
    )


async def queue_history(
    node: QueueEngine, db: Database, name: str, uid: str, node_name: str, limit: int
) -> History:
    """The runs of queue ``name`` (incarnation ``uid``) to show on node ``node_name``,
    newest first, at most ``limit`` of each (see the module's rule)."""
    asked = await node.leader_history(name)
    if asked is not None and asked.status == "ok":
        return History(
            "leader",
            asked.from_node or "",
            "",
            [repo.snapshot_facts(r) for r in asked.history.snapshots[:limit]],
            [repo.compaction_facts(r) for r in asked.history.compactions[:limit]],
        )
    snapshots, compactions = await db.run(lambda s: _local(s, name, uid, limit))
    return History(
        "local" if asked is None else "absent",
        node_name,
        "" if asked is None else asked.detail,
        snapshots,
        compactions,
    )


__all__ = [
    "HISTORY_HEADERS_DOC",
    "HISTORY_NODE_HEADER",
    "HISTORY_SOURCE_HEADER",
    "History",
    "history_source",
    "queue_history",
]
