"""``/api/v1/queues``: create, list, show, change policies, delete and purge queues.

``PUT`` answers 201 when it created the queue, 200 when the same queue existed, 409 when
it exists with other arguments. Listing shows the queues the caller holds any
permission on; showing one needs any permission on it. Setting a ``dead_letter_queue``
(on create or by a policy change) also needs ``read`` on the queue and ``write`` on the
target (its messages will flow there), and may not be the queue itself. Every change goes through ``app.queue_admin`` (engine first, then the
SQLite mirror and the audit log, in the request's transaction).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Body, Request, Response, status

from app import queue_admin
from app.api.deps import API_PREFIX, DatabaseDep, PrincipalDep, QueueName, client_addr
from app.api.queue_deps import CanConfigure, CanSee, NodeDep
from app.api.queue_schemas import PurgedOut, QueueArgsIn, QueueArgsOut, QueueOut, QueuePatch
from app.auth import Principal
from app.negotiation import NegotiatedRoute
from app.problems import problem_responses
from engine.errors import QueueNotFound, ValidationFailed
from engine.runtime.api import QueueArgs, QueueEngine, QueueInfo

router = APIRouter(prefix=f"{API_PREFIX}/queues", tags=["queues"], route_class=NegotiatedRoute)

PROBLEMS = problem_responses(400, 401, 403, 404, 409, 415, 422, 503)


def actor(request: Request, who: Principal) -> queue_admin.Actor:
    return queue_admin.Actor(who.name, "api", client_addr(request))


def info_of(node: QueueEngine, name: str) -> QueueInfo:
    for info in node.queues():
        if info.name == name:
            return info
    raise QueueNotFound(f"no queue {name!r}")


def queue_out(
    node: QueueEngine, info: QueueInfo, stats: dict[str, object] | None = None
) -> QueueOut:
    """A queue's answer; its stats as the node has them unless ``stats`` are given."""
    return QueueOut(
        name=info.name,
        arguments=QueueArgsOut.model_validate(queue_admin.args_dict(info.args)),
        created_at=datetime.fromtimestamp(info.created_at_ms / 1000, tz=UTC),
        stats=node.stats(info.name) if stats is None else stats,
    )


@router.get("", response_model=list[QueueOut], responses=PROBLEMS)
async def list_queues(who: PrincipalDep, node: NodeDep) -> list[QueueOut]:
    """The queues the caller holds any permission on, by name, with their stats. In a
    cluster each queue's stats are its leader's as this node last fetched them (one
    periodic call per leader node, not one per queue): ``stats.remote`` names the leader
    (``from_node``) and their age (``age_ms``); older than 2 s, or a follower's own copy
    when nothing came from its leader yet, they are marked ``status: "stale"``."""
    infos = sorted(node.queues(), key=lambda q: q.name)
    return [queue_out(node, q) for q in infos if who.can_see(q.name)]


@router.put(
    "/{name}",
    response_model=QueueOut,
    status_code=status.HTTP_201_CREATED,
    responses={
        **PROBLEMS,
        200: {"model": QueueOut, "description": "Existed with these arguments."},
    },
)
async def put_queue(
    name: QueueName,
    request: Request,
    response: Response,
    db: DatabaseDep,
    who: CanConfigure,
    node: NodeDep,
    body: Annotated[QueueArgsIn | None, Body()] = None,
) -> QueueOut:
    args_in = body or QueueArgsIn()
    queue_admin.check_dead_letter_target(who, name, args_in.dead_letter_queue)
    args = QueueArgs(**args_in.model_dump())
    info, created = await queue_admin.create_queue(node, db, actor(request, who), name, args)
    response.status_code = status.HTTP_201_CREATED if created else status.HTTP_200_OK
    return queue_out(node, info, await node.fresh_stats(info.name))


@router.get("/{name}", response_model=QueueOut, responses=PROBLEMS)
async def get_queue(name: QueueName, _who: CanSee, node: NodeDep) -> QueueOut:
    info = info_of(node, name)
    return queue_out(node, info, await node.fresh_stats(name))


@router.patch("/{name}", response_model=QueueOut, responses=PROBLEMS)
async def patch_queue(
    name: QueueName,
    body: QueuePatch,
    request: Request,
    db: DatabaseDep,
    who: CanConfigure,
    node: NodeDep,
) -> QueueOut:
    """Change some of the queue's policies (the others stay). The change commits in the
    queue's own Raft log, so that every replica applies it in order with the messages;
    in a cluster its leader then records it in the cluster metadata, which every node
    lists the queue from, and each node's SQLite row of the queue follows once it
    applied that record (a node that crashed in between records it on its next
    reconcile pass)."""
    changes = body.changes()
    if not changes:
        raise ValidationFailed("send at least one policy to change")
    if "dead_letter_queue" in changes:
        queue_admin.check_dead_letter_target(who, name, body.dead_letter_queue)
    info = await queue_admin.update_policy(node, db, actor(request, who), name, changes)
    return queue_out(node, info)


@router.delete("/{name}", status_code=status.HTTP_204_NO_CONTENT, responses=PROBLEMS)
async def delete_queue(
    name: QueueName, request: Request, db: DatabaseDep, who: CanConfigure, node: NodeDep
) -> Response:
    """Delete the queue with its messages and history."""
    await queue_admin.delete_queue(node, db, actor(request, who), name)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/{name}/purge", response_model=PurgedOut, responses=PROBLEMS)
async def purge_queue(
    name: QueueName, request: Request, db: DatabaseDep, who: CanConfigure, node: NodeDep
) -> PurgedOut:
    """Drop every ready message; leased messages stay with their consumers."""
    purged = await queue_admin.purge_queue(node, db, actor(request, who), name)
    return PurgedOut(purged=purged)
