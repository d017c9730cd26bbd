"""What a node tells of its cluster (``GET /cluster``): each node's health, the queues it
leads, its state in the metadata and the queues placed on it.

Rule: a peer is ``up`` when a Raft message came from it within two election timeouts
(``Node`` keeps when each node was last heard), ``down`` when the transport has no link
to it, ``unknown`` otherwise. The nodes listed are the transport's and the metadata's: a
forgotten node is no longer a peer, but the operator still sees it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING

from engine.cluster import moving
from engine.ids import NodeName
from engine.runtime.replica import node_of

if TYPE_CHECKING:
    from engine.runtime.context import NodeContext


def cluster_view(ctx: NodeContext, heard_ms: Mapping[str, int]) -> dict[str, object]:
    """The ``GET /cluster`` body; ``heard_ms``: node -> monotonic time of its last Raft
    message here."""
    now = ctx.clock.monotonic_ms()
    alive_ms = 2 * ctx.limits.election_timeout_ms_max
    nodes = []
    links = ctx.transport.health()
    for node in node_names(ctx):
        led = sorted(
            rep.name
            for rep in ctx.replicas.values()
            if (leader := rep.leader_id) is not None and node_of(leader) == node
        )
        entry: dict[str, object] = {"name": node, "leads": led, "self": node == ctx.name}
        if node == ctx.name:
            entry["health"] = "up" if ctx.running else "down"
        else:
            heard = heard_ms.get(node)
            link = links.get(node)
            if heard is not None and now - heard <= alive_ms:
                entry["health"] = "up"
            else:
                entry["health"] = "down" if link is not None and not link.connected else "unknown"
            if link is not None:
                entry.update(dataclasses.asdict(link))
                entry["raft_heard_ms"] = None if heard is None else now - heard
        entry.update(placed_on(ctx, node))
        nodes.append(entry)
    refused = dict(sorted(ctx.receiving.refused.items()))
    return {"node": ctx.name, "nodes": nodes, "refused_from_peers": refused}


def node_names(ctx: NodeContext) -> list[NodeName]:
    """The transport's nodes, and those the metadata records (a forgotten node is no
    longer a peer, but still listed)."""
    group = ctx.meta_group
    recorded = [] if group is None or group.driver is None else list(group.machine.nodes)
    return sorted({*ctx.transport.nodes(), *map(NodeName, recorded)})


def placed_on(ctx: NodeContext, node: str) -> dict[str, object]:
    """The node's state in the metadata and the queues it should host (a single node:
    active, and its own queues)."""
    group = ctx.meta_group
    if group is None:
        return {"state": "active", "replicas": sorted(ctx.replicas)}
    machine = group.machine
    rec = machine.nodes.get(node)
    replicas = moving.holding(machine.queues.values(), node)
    return {"state": "unknown" if rec is None else rec.state, "replicas": replicas}


__all__ = ["cluster_view", "node_names", "placed_on"]
