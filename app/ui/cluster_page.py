"""The dashboard's Cluster page: every node with its link as the transport sees it
(connected, last heard, round trip, drops, the last error), its state in the metadata and
the queues placed on it, the queues each leads, and a form per queue to move its
leadership (``app.cluster_admin``, as ``POST /api/v1/queues/{name}/leader``). Admins of a
cluster also get a Drain button per active node and a Forget button per node that is not
up (as ``POST /api/v1/cluster/nodes/{node}/drain``, ``.../forget`` and ``.../activate``). The live part
refreshes with the page's tick.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Path, Request
from fastapi.responses import HTMLResponse

from app import cluster_admin
from app.api.queue_ops import cluster_seen_by
from app.problems import AppProblem, Forbidden
from app.state import db_of, node_or_none
from app.ui.actions import done
from app.ui.common import actor_of, can, error_flash, flash, node_of, render
from app.ui.sessions import UiLogin
from app.ui.views import CsrfLoginDep, LoginDep
from engine.errors import QuorraError, ValidationFailed

router = APIRouter(include_in_schema=False)
NodeName = Annotated[str, Path(min_length=1, max_length=200)]


def _members(request: Request, name: str) -> list[str]:
    raft = node_of(request).stats(name).get("raft", {})
    members = raft.get("members", []) if isinstance(raft, dict) else []
    return sorted(str(m["node"]) for m in members if isinstance(m, dict) and "node" in m)


def _context(request: Request, login: UiLogin) -> dict[str, object]:
    node = node_or_none(request.app.state)
    if node is None:
        return {"cluster": {"node": "", "nodes": []}, "movable": {}, "node_actions": False}
    cluster = cluster_seen_by(node, login.principal)
    movable: dict[str, list[str]] = {}
    nodes = cluster.get("nodes", [])
    for entry in nodes if isinstance(nodes, list) else []:
        for name in entry.get("leads", []):
            if can(login.principal, "configure", name):
                movable[name] = [m for m in _members(request, name) if m != entry["name"]]
    clustered = isinstance(nodes, list) and len(nodes) > 1
    actions = clustered and login.principal.is_admin
    return {"cluster": cluster, "movable": movable, "node_actions": actions}


@router.get("/cluster", response_class=HTMLResponse)
async def cluster_page(request: Request, login: LoginDep) -> HTMLResponse:
    return render(request, "cluster.html", _context(request, login), login)


@router.get("/fragments/cluster", response_class=HTMLResponse)
async def cluster_live(request: Request, login: LoginDep) -> HTMLResponse:
    return render(request, "_cluster_live.html", _context(request, login), login)


@router.post("/cluster/leader", response_class=HTMLResponse)
async def move_leader(request: Request, login: CsrfLoginDep) -> HTMLResponse:
    form = await request.form()
    name, wanted = str(form.get("queue", "")), str(form.get("node", "")) or None
    try:
        if not name:
            raise ValidationFailed("choose a queue")
        if not can(login.principal, "configure", name):
            raise ValidationFailed(f"you may not configure {name}")
        leader = await cluster_admin.transfer_leadership(
            node_of(request), db_of(request.app.state), actor_of(request, login), name, wanted
        )
    except (QuorraError, AppProblem) as e:
        return error_flash(request, e)
    return done(request, f"{leader} leads {name} now.", queue=name)


NodeAction = Literal["drain", "forget", "activate"]
_VERBS = {
    "drain": "draining",
    "forget": "lost: its replicas are being replaced",
    "activate": "active again",
}


async def _node_action(
    request: Request, login: UiLogin, name: str, action: NodeAction
) -> HTMLResponse:
    try:
        if not login.principal.is_admin:
            raise Forbidden(f"user {login.principal.name!r} is not an admin")
        entry = await cluster_admin.move_node(
            node_of(request), db_of(request.app.state), actor_of(request, login), name, action
        )
    except (QuorraError, AppProblem) as e:
        return error_flash(request, e)
    replicas = entry.get("replicas", [])
    count = len(replicas) if isinstance(replicas, list) else 0
    placed = "placed on it" if action == "activate" else "to move"
    response = flash(request, f"{name} is {_VERBS[action]} ({count} replicas {placed}).")
    response.headers["HX-Trigger"] = "quorra:tick"
    return response


@router.post("/cluster/nodes/{name}/drain", response_class=HTMLResponse)
async def drain_node(name: NodeName, request: Request, login: CsrfLoginDep) -> HTMLResponse:
    return await _node_action(request, login, name, "drain")


@router.post("/cluster/nodes/{name}/forget", response_class=HTMLResponse)
async def forget_node(name: NodeName, request: Request, login: CsrfLoginDep) -> HTMLResponse:
    return await _node_action(request, login, name, "forget")


@router.post("/cluster/nodes/{name}/activate", response_class=HTMLResponse)
async def activate_node(name: NodeName, request: Request, login: CsrfLoginDep) -> HTMLResponse:
    return await _node_action(request, login, name, "activate")


__all__ = ["router"]
