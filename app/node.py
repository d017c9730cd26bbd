"""Where the queue engine attaches to the app.

The lifespan (app/main.py) calls ``start_node`` after the metadata is migrated and
before the app reports ready, stores the result in ``app.state.node``, and calls
``stop_node`` first on shutdown, before the database closes. Routers reach the node
through ``NodeDep`` (app/api/deps.py), which answers 503 ``/problems/no-leader``
while there is none.

Until ``engine.runtime`` exists, ``start_node`` returns ``None``: the server runs
its auth, metadata and operations endpoints without queues. The engine plugs in by
replacing the body of ``start_node`` with, roughly::

    node = Node(data_dir=settings.data_dir, name=settings.node_name, limits=settings.limits)
    await node.start()          # recovers every queue from its checkpoint + WAL tail
    reconcile(db, node)         # queue definitions in SQLite vs. queues in the engine
    return node

Anything with ``async stop()`` and a ``recovered`` flag fits ``NodeHandle``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from app.db.session import Database
from app.settings import Settings


class NodeHandle(Protocol):
    @property
    def recovered(self) -> bool:
        """True once every hosted queue has recovered from disk and can serve."""
        ...

    async def stop(self) -> None:
        """Flush and close everything; nothing confirmed may be lost."""
        ...


NodeStarter = Callable[[Settings, Database], Awaitable[NodeHandle | None]]


async def start_node(settings: Settings, db: Database) -> NodeHandle | None:
    """Start the engine for this data directory; ``None`` while there is no engine."""
    return None


async def stop_node(node: NodeHandle | None) -> None:
    if node is not None:
        await node.stop()
