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
``make_node`` builds ``engine.runtime.Node``: a single-node cluster named after
``settings.node_name``, or, with ``settings.cluster``, a node of that cluster on a
``TcpTransport``, hosting the cluster's metadata group (``MetaBootstrap``). Such a transport is the node's network: the lifespan starts it (binds
the cluster port, dials the peers) before ``node.start()`` and closes it after
``node.stop()`` (``running_network``). Tests pass another factory, or one returning
``None``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Protocol, cast

import anyio

from app.cluster_settings import ClusterSettings, format_address
from app.db import repo
from app.db.session import Database
from app.memory_trim import malloc_trim
from app.queue_admin import mirror_definition
from app.settings import Settings
from engine.ids import NodeName
from engine.node_key import RECEIPT_KEY_LABEL, derive_key
from engine.runtime.api import (
    CheckpointRecord,
    CompactionRecord,
    HistorySource,
    QueueEngine,
    QueueInfo,
    RecordListener,
)
from engine.runtime.transport import Transport

if TYPE_CHECKING:
    from engine.runtime.meta_group import MetaBootstrap, MetaGroup
    from engine.runtime.tcp_transport import TcpTransport

NodeFactory = Callable[[Settings], QueueEngine | None]
log = logging.getLogger("quorra.app")


class NodeNetwork(Transport, Protocol):
    """A transport with a life of its own around the node's (``TcpTransport``)."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    @property
    def listen_port(self) -> int: ...


def make_node(settings: Settings) -> QueueEngine | None:
    """The engine node for this data directory (construction only, no I/O)."""
    from engine.runtime.node import Node  # imported here: `quorra user add` needs no engine

    cluster = settings.cluster
    if cluster is None:
        node = Node(settings.data_dir, node_name=settings.node_name, limits=settings.limits)
    else:
        node = Node(
            settings.data_dir,
            node_name=cluster.node_id,
            limits=settings.limits,
            transport=tcp_transport(cluster, settings),
            # Any member may lead a queue after a failover, and the new leader settles the
            # receipts the old one sealed: the key comes from the secret the cluster shares,
            # not from this node's own secret.key.
            receipt_key=derive_key(cluster.secret, RECEIPT_KEY_LABEL),
            cluster=meta_bootstrap(cluster),
        )
    trim = malloc_trim()
    if trim is not None:
        node.trim_memory_with(trim)
    return node


def meta_bootstrap(cluster: ClusterSettings) -> MetaBootstrap:
    """What the node's metadata group starts from: the cluster id and every member's
    cluster address (the first leader of a new cluster proposes them)."""
    from engine.runtime.meta_group import MetaBootstrap

    assert cluster.cluster_id is not None, "start-up settles the cluster id first"
    if cluster.joined:
        # Not an initial member: the metadata's leader adds it, and knows the others.
        return MetaBootstrap(cluster.cluster_id, {}, joined=True, incarnation=cluster.incarnation)
    members = {name: format_address(address) for name, address in cluster.peers.items()}
    members[cluster.node_id] = format_address(cluster.listen)
    return MetaBootstrap(cluster.cluster_id, members, incarnation=cluster.incarnation)


def tcp_transport(cluster: ClusterSettings, settings: Settings) -> TcpTransport:
    """The cluster's ``TcpTransport`` for this node (construction only, no I/O)."""
    from engine.runtime.tcp_transport import TcpTransport, TlsConfig  # a cluster node only

    assert cluster.cluster_id is not None, "start-up settles the cluster id first"
    tls = cluster.tls
    return TcpTransport(
        NodeName(cluster.node_id),
        listen=cluster.listen,
        peers={NodeName(name): address for name, address in cluster.peers.items()},
        cluster_id=cluster.cluster_id,
        secret=cluster.secret,
        limits=settings.limits,
        incarnation=cluster.incarnation,
        tls=None
        if tls is None
        else TlsConfig(
            cert_file=str(tls.cert_file), key_file=str(tls.key_file), ca_file=str(tls.ca_file)
        ),
    )


def metadata_of(node: QueueEngine) -> MetaGroup | None:
    """A cluster node's metadata group (``None`` on a single node or another engine)."""
    from engine.runtime.node import Node

    return node.context.meta_group if isinstance(node, Node) else None


def on_forgotten(node: QueueEngine, callback: Callable[[str], None]) -> None:
    """Have ``callback`` called (with the log line) if the cluster forgets this node."""
    from engine.runtime.node import Node

    if isinstance(node, Node):
        node.on_forgotten = callback


def serve_history(node: QueueEngine, source: HistorySource) -> None:
    """Have a cluster node answer its peers' questions about a queue's history (the
    runs of its replicas) from ``source``."""
    from engine.runtime.node import Node

    if isinstance(node, Node):
        node.set_history_source(source)


def node_network(node: QueueEngine) -> NodeNetwork | None:
    """The node's transport when it is a network to start and close around the node."""
    transport = getattr(node, "transport", None)
    if callable(getattr(transport, "start", None)) and callable(getattr(transport, "close", None)):
        return cast(NodeNetwork, transport)
    return None


@asynccontextmanager
async def running_network(node: QueueEngine | None) -> AsyncIterator[NodeNetwork | None]:
    """The node's network started for the body (which starts and stops the node), closed
    after it: closing fails the calls still waiting on peers, which a stopping node no
    longer makes."""
    network = None if node is None else node_network(node)
    if network is None:
        yield None
        return
    await network.start()
    try:
        yield network
    finally:
        await network.close()


def store_record(
    db: Database, record: CheckpointRecord | CompactionRecord, listed: Sequence[QueueInfo] = ()
) -> bool:
    """Add an engine record to the queue's history; False when the queue is unknown here.
    A queue the engine lists (``listed``) but SQLite does not hold yet (created through
    another node of a cluster) gets its row first."""
    with db.transaction() as session:
        queue = repo.get_queue(session, record.queue)
        if queue is None:
            info = next((q for q in listed if q.name == record.queue), None)
            if info is None:
                return False
            queue = mirror_definition(session, info)
        if isinstance(record, CheckpointRecord):
            repo.record_snapshot(session, queue.uid, repo.snapshot_facts(record))
        else:
            repo.record_compaction(session, queue.uid, repo.compaction_facts(record))
    return True


def record_listener(db: Database, node: QueueEngine | None = None) -> RecordListener:
    """The listener the node calls after each automatic checkpoint or compaction, and
    after each one another node of a cluster asked its replica for (manual ones run here
    come back from `node.checkpoint`/`node.compact`; the router stores those)."""

    async def listener(record: CheckpointRecord | CompactionRecord) -> None:
        stored = await anyio.to_thread.run_sync(store_record, db, record)
        if not stored and node is not None:
            # Its row may not be mirrored yet: the engine's listing (on the loop, which
            # owns the engine) is taken only then, not for every record.
            listed = [q for q in node.queues() if q.name == record.queue]
            stored = await anyio.to_thread.run_sync(store_record, db, record, listed)
        if not stored:
            log.warning("history record for unknown queue %r dropped", record.queue)

    return listener
