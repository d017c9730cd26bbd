"""Dependencies of the queue and message routers, all ``async``: FastAPI runs a plain
``def`` dependency on a worker thread, and on the publish/receive hot path those thread
hops cost more than the work (profiled with ``quorra bench rest --profile``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends, Request
from starlette.datastructures import State

from app.api.deps import PrincipalDep, QueueName
from app.auth import Permission, Principal, require
from app.problems import Forbidden
from app.state import node_or_none
from engine.errors import NoLeader
from engine.runtime.api import QueueEngine


def queue_access(permission: Permission) -> Callable[[str, Principal], Awaitable[Principal]]:
    """The caller, once allowed ``permission`` on the ``{name}`` queue (else 403)."""

    async def dependency(name: QueueName, principal: PrincipalDep) -> Principal:
        require(principal, permission, name)
        return principal

    dependency.__name__ = f"can_{permission}"
    return dependency


async def can_see(name: QueueName, principal: PrincipalDep) -> Principal:
    """Any of configure, write or read on the queue lets a user see it."""
    if not principal.can_see(name):
        raise Forbidden(f"user {principal.name!r} has no permission on {name!r}")
    return principal


async def get_node(request: Request) -> QueueEngine:
    return running_node(request.app.state)


def running_node(state: State) -> QueueEngine:
    """The app's engine node (``state`` is the app's), or 503 when it is not running."""
    node = node_or_none(state)
    if node is None:
        raise NoLeader("the queue engine is not running on this node")
    return node


CanConfigure = Annotated[Principal, Depends(queue_access("configure"))]
CanWrite = Annotated[Principal, Depends(queue_access("write"))]
CanRead = Annotated[Principal, Depends(queue_access("read"))]
CanSee = Annotated[Principal, Depends(can_see)]
NodeDep = Annotated[QueueEngine, Depends(get_node)]
