"""Snapshots (checkpoints), compaction, segments, the cluster, members and leadership.

History (``GET .../snapshots``, ``GET .../compactions``) comes from SQLite, where manual
runs are stored by these endpoints and automatic ones by the node's record listener; a
cluster node without a replica of the queue asks its leader's node for its SQLite's
(``app.queue_history``). Current state (segments, the log now, the cluster) comes from
the engine.

Membership and leadership go through ``app.cluster_admin`` (shared with the dashboard),
which answers once the change has committed, or 409 ``/problems/single-node-cluster``
on a single node.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Path, Request, Response, status

from app import cluster_admin, queue_admin
from app.api.deps import API_PREFIX, AdminDep, DatabaseDep, PrincipalDep, QueueName
from app.api.queue_deps import CanConfigure, CanSee, NodeDep
from app.api.queue_schemas import (
    CompactionIn,
    CompactionOut,
    CompactionsOut,
    LeaderIn,
    LeaderOut,
    MemberIn,
    NodeStateOut,
    QueueOut,
    SegmentOut,
    SnapshotOut,
)
from app.api.queues import PROBLEMS, actor, info_of, queue_out
from app.auth import Principal
from app.db import repo
from app.db.models import CompactionEntry, SnapshotEntry
from app.negotiation import NegotiatedRoute
from app.problems import problem_responses
from app.queue_history import HISTORY_HEADERS_DOC, History, queue_history
from app.state import settings_of
from engine.runtime.api import CheckpointRecord, CompactionRecord, QueueEngine

router = APIRouter(
    prefix=API_PREFIX, tags=["snapshots and compaction"], route_class=NegotiatedRoute
)
cluster_router = APIRouter(prefix=API_PREFIX, tags=["cluster"], route_class=NegotiatedRoute)


def snapshot_out(row: repo.SnapshotFacts | SnapshotEntry | CheckpointRecord) -> SnapshotOut:
    facts = repo.snapshot_facts(row) if isinstance(row, CheckpointRecord) else row
    return SnapshotOut(
        index=facts.raft_index,
        term=facts.term,
        taken_at=facts.taken_at,
        bytes=facts.bytes,
        live_entries=facts.live_entries,
        trigger="auto" if facts.trigger == "auto" else "manual",
        duration_ms=facts.duration_ms,
    )


def compaction_out(row: repo.CompactionFacts | CompactionEntry | CompactionRecord) -> CompactionOut:
    facts = repo.compaction_facts(row) if isinstance(row, CompactionRecord) else row
    return CompactionOut(
        phase=facts.phase,
        trigger="auto" if facts.trigger == "auto" else "manual",
        started_at=facts.started_at,
        duration_ms=facts.duration_ms,
        segments_before=facts.segments_before,
        segments_after=facts.segments_after,
        bytes_before=facts.bytes_before,
        bytes_after=facts.bytes_after,
        live_entries=facts.live_entries,
        dead_entries_before=facts.dead_entries_before,
        dead_entries_after=facts.dead_entries_after,
    )


async def _history(request: Request, db: DatabaseDep, node: QueueEngine, name: str) -> History:
    info = info_of(node, name)  # 404 when the engine has no such queue
    here = settings_of(request.app.state).node_name
    return await queue_history(node, db, name, info.uid, here, repo.HISTORY_ROWS_MAX)


HISTORY_RESPONSES = PROBLEMS | {200: {"headers": HISTORY_HEADERS_DOC}}


# --- snapshots ---------------------------------------------------------------------


@router.post(
    "/queues/{name}/snapshots",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=SnapshotOut,
    responses=PROBLEMS,
)
async def take_snapshot(
    name: QueueName, request: Request, db: DatabaseDep, who: CanConfigure, node: NodeDep
) -> SnapshotOut:
    """Take a checkpoint now (the log is not truncated; compaction reclaims dead entries).
    On a cluster node that holds no replica of the queue, of its leader's replica."""
    record = await queue_admin.take_checkpoint(node, db, actor(request, who), name)
    return snapshot_out(record)


@router.get(
    "/queues/{name}/snapshots", response_model=list[SnapshotOut], responses=HISTORY_RESPONSES
)
async def list_snapshots(
    name: QueueName,
    request: Request,
    response: Response,
    db: DatabaseDep,
    _who: CanSee,
    node: NodeDep,
) -> list[SnapshotOut]:
    """Checkpoint history, newest first: of this node's replica of the queue (with the
    runs asked through this node). A cluster node without a replica asks the queue's
    leader's node for its replica's runs (at most 100; ``Quorra-History: leader``, and
    ``Quorra-History-Node`` names it); when no leader answers within 2 s it lists the
    runs asked through itself, with ``Quorra-History: absent``."""
    history = await _history(request, db, node, name)
    history.mark(response)
    return [snapshot_out(r) for r in history.snapshots]


# --- compaction --------------------------------------------------------------------


@router.post(
    "/queues/{name}/compactions",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=CompactionOut,
    responses=PROBLEMS,
)
async def compact(
    name: QueueName,
    request: Request,
    db: DatabaseDep,
    who: CanConfigure,
    node: NodeDep,
    body: Annotated[CompactionIn | None, Body()] = None,
) -> CompactionOut:
    """Run compaction now: ``auto`` (phases until dead entries are few enough) or 1, 2, 3.
    On a cluster node that holds no replica of the queue, on its leader's replica."""
    phase = (body or CompactionIn()).phase
    record = await queue_admin.run_compaction(node, db, actor(request, who), name, phase)
    return compaction_out(record)


@router.get(
    "/queues/{name}/compactions", response_model=CompactionsOut, responses=HISTORY_RESPONSES
)
async def list_compactions(
    name: QueueName,
    request: Request,
    response: Response,
    db: DatabaseDep,
    _who: CanSee,
    node: NodeDep,
) -> CompactionsOut:
    """The log now and the compaction runs, newest first. Whose runs, as for snapshots
    (``Quorra-History``, ``Quorra-History-Node``): this node's replica's, or on a cluster
    node without a replica its leader's node's (the log now is the leader's there too)."""
    history = await _history(request, db, node, name)
    history.mark(response)
    log = node.stats(name).get("log", {})
    return CompactionsOut(
        current=dict(log) if isinstance(log, dict) else {},
        history=[compaction_out(r) for r in history.compactions],
    )


@router.get("/queues/{name}/segments", response_model=list[SegmentOut], responses=PROBLEMS)
async def list_segments(name: QueueName, _who: CanSee, node: NodeDep) -> list[SegmentOut]:
    """Each segment file of the queue's log: index range, bytes, live and dead entries. On
    a cluster node that holds no replica of the queue: those of its leader's replica."""
    info_of(node, name)
    segments = await node.fresh_segments(name)
    return [SegmentOut.model_validate(s, from_attributes=True) for s in segments]


# --- cluster -----------------------------------------------------------------------


def cluster_seen_by(node: QueueEngine, who: Principal) -> dict[str, object]:
    """``node.cluster()`` with each node's ``leads`` and ``replicas`` narrowed to the
    queues ``who`` may see (the rule of ``GET /queues``): the nodes and their health are everyone's."""
    cluster = dict(node.cluster())
    nodes = cluster.get("nodes")
    if isinstance(nodes, list):
        cluster["nodes"] = [
            {
                **n,
                "leads": [q for q in n.get("leads", []) if who.can_see(q)],
                "replicas": [q for q in n.get("replicas", []) if who.can_see(q)],
            }
            if isinstance(n, dict)
            else n
            for n in nodes
        ]
    return cluster


@cluster_router.get("/cluster", responses=PROBLEMS)
async def cluster(who: PrincipalDep, node: NodeDep) -> dict[str, object]:
    """Nodes, their health, the queues each leads, each node's ``state`` in the cluster
    metadata (``active``, ``draining``, ``lost``, ``forgotten``) and the queues placed on
    it (``replicas``): of those the caller may see."""
    return cluster_seen_by(node, who)


MEMBER_PROBLEMS = PROBLEMS | problem_responses(409)


def node_state_out(entry: dict[str, object], who: Principal) -> NodeStateOut:
    replicas = entry.get("replicas", [])
    shown = [q for q in replicas if who.can_see(q)] if isinstance(replicas, list) else []
    return NodeStateOut.model_validate({**entry, "replicas": shown})


NodeName = Annotated[str, Path(min_length=1, max_length=200, description="A node's id.")]


@cluster_router.post(
    "/cluster/nodes/{node_name}/drain",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=NodeStateOut,
    responses=MEMBER_PROBLEMS,
)
async def drain_node(
    node_name: NodeName, request: Request, db: DatabaseDep, who: AdminDep, node: NodeDep
) -> NodeStateOut:
    """Admins: mark the node ``draining`` in the cluster metadata. It receives no new
    replicas; the queues it leads hand their leadership to another member, then each of
    its replicas moves to an active node (the queue's leader adds a replica there, which
    catches up as a learner and becomes a voter, then removes the one on the draining
    node; one change at a time per queue, resumed after a crash). Answers once the state
    committed, with the node's ``state`` and the queues still placed on it (``replicas``;
    ``GET /cluster`` shows them shrink). A replica no active node can take stays. 404 for
    a node the cluster does not know, 409 for a node lost or forgotten, or a single node."""
    entry = await cluster_admin.move_node(node, db, actor(request, who), node_name, "drain")
    return node_state_out(entry, who)


@cluster_router.post(
    "/cluster/nodes/{node_name}/activate",
    response_model=NodeStateOut,
    responses=MEMBER_PROBLEMS,
)
async def activate_node(
    node_name: NodeName, request: Request, db: DatabaseDep, who: AdminDep, node: NodeDep
) -> NodeStateOut:
    """Admins: mark a ``draining`` node ``active`` again (the undo of a drain; also a
    ``lost`` node that came back). It takes new replicas and leaderships again; moves
    still to come off it stop, those done stay done. Answers once the state committed.
    404 for a node the cluster does not know, 409 for one forgotten, or a single node."""
    entry = await cluster_admin.move_node(node, db, actor(request, who), node_name, "activate")
    return node_state_out(entry, who)


@cluster_router.post(
    "/cluster/nodes/{node_name}/forget",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=NodeStateOut,
    responses=MEMBER_PROBLEMS,
)
async def forget_node(
    node_name: NodeName, request: Request, db: DatabaseDep, who: AdminDep, node: NodeDep
) -> NodeStateOut:
    """Admins: declare a dead node ``lost``. Each queue's leader replaces the node's
    replica on an active node (or, when none can take it, removes it while another member
    stays), and once no queue places a replica on it the node is ``forgotten``: a
    forgotten node that starts again is refused and exits. Answers once ``lost``
    committed, with the node's ``state`` and the queues still placed on it. 404 for a
    node the cluster does not know, 409 for one forgotten already, or a single node."""
    entry = await cluster_admin.move_node(node, db, actor(request, who), node_name, "forget")
    return node_state_out(entry, who)


@cluster_router.post("/queues/{name}/members", responses=MEMBER_PROBLEMS)
async def add_member(
    name: QueueName,
    body: MemberIn,
    request: Request,
    db: DatabaseDep,
    who: CanConfigure,
    node: NodeDep,
) -> QueueOut:
    """Add a replica on ``node``: it joins as a learner, catches up and becomes a voter
    (one change at a time; 409 while another runs). Answers once the change committed."""
    info = await cluster_admin.add_member(node, db, actor(request, who), name, body.node)
    return queue_out(node, info)


@cluster_router.delete("/queues/{name}/members/{node_name}", responses=MEMBER_PROBLEMS)
async def remove_member(
    name: QueueName,
    node_name: Annotated[str, Path(min_length=1, max_length=200)],
    request: Request,
    db: DatabaseDep,
    who: CanConfigure,
    node: NodeDep,
) -> QueueOut:
    """Remove the replica on ``node_name`` (one change at a time); its data is deleted
    once the change committed. Answers with the queue as it is now."""
    info = await cluster_admin.remove_member(node, db, actor(request, who), name, node_name)
    return queue_out(node, info)


@cluster_router.post("/queues/{name}/leader", response_model=LeaderOut, responses=MEMBER_PROBLEMS)
async def transfer_leader(
    name: QueueName,
    request: Request,
    db: DatabaseDep,
    who: CanConfigure,
    node: NodeDep,
    body: Annotated[LeaderIn | None, Body()] = None,
) -> LeaderOut:
    """Hand the queue's leadership to ``node`` (or the most up-to-date follower); answers
    once that node leads (503 ``no-leader`` when it did not take over in time)."""
    wanted = (body or LeaderIn()).node
    target = await cluster_admin.transfer_leadership(node, db, actor(request, who), name, wanted)
    return LeaderOut(leader=target)
