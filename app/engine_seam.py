"""Where the queue engine attaches to the app.

The node is an ``engine.runtime.api.QueueEngine``. The lifespan (app/main.py):

1. after migrations and bootstrap, calls ``make_node(settings)`` (construction only,
   no I/O); ``None`` means this build has no engine and the server runs its auth,
   metadata and operations endpoints without queues;
2. registers ``record_listener(db)`` so that automatic checkpoints and compactions land
   in the SQLite history, then awaits ``node.start()`` (recovery) while ``/readyz``
   says ``engine: recovering``;
3. stores the node in ``app.state.node`` and reports ready;
4. on shutdown, first takes the node out of ``app.state``, awaits ``node.stop()``, and
   only then closes the database.

Routers reach the node through ``NodeDep`` (app/api/deps.py), 503 while there is none.
``make_node`` builds ``engine.runtime.Node`` (a single-node cluster named after
``settings.node_name``); tests pass another factory, or one returning ``None``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import anyio

from app.db import repo
from app.db.session import Database
from app.settings import Settings
from engine.runtime.api import CheckpointRecord, CompactionRecord, QueueEngine, RecordListener

NodeFactory = Callable[[Settings], QueueEngine | None]
log = logging.getLogger("quorra.app")


def make_node(settings: Settings) -> QueueEngine | None:
    """The engine node for this data directory (construction only, no I/O)."""
    from engine.runtime.node import Node  # imported here: `quorra user add` needs no engine

    return Node(settings.data_dir, node_name=settings.node_name, limits=settings.limits)


def store_record(db: Database, record: CheckpointRecord | CompactionRecord) -> bool:
    """Add an engine record to the queue's history; False when the queue is unknown here."""
    with db.transaction() as session:
        queue = repo.get_queue(session, record.queue)
        if queue is None:
            return False
        if isinstance(record, CheckpointRecord):
            repo.record_snapshot(session, queue.uid, repo.snapshot_facts(record))
        else:
            repo.record_compaction(session, queue.uid, repo.compaction_facts(record))
    return True


def record_listener(db: Database) -> RecordListener:
    """The listener the node calls after each automatic checkpoint or compaction (manual
    ones come back from `node.checkpoint`/`node.compact`; the router stores those)."""

    async def listener(record: CheckpointRecord | CompactionRecord) -> None:
        stored = await anyio.to_thread.run_sync(store_record, db, record)
        if not stored:
            log.warning("history record for unknown queue %r dropped", record.queue)

    return listener
