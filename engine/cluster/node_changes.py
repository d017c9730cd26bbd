"""The cluster and its nodes in the metadata: bootstrap, join, and each node's state.

Rule of this module: the cluster id is set once, by the first entry. A node joins
``active``; the operator (or the runtime's health checks) moves it along ``NODE_MOVES``:
``draining`` and ``lost`` nodes receive no new replicas; a node is ``forgotten`` only once
no creating or live queue places a replica on it (its replicas were replaced first), and
forgetting it counts it as having dropped its replicas of queues being deleted, so that
their deletion does not wait for a node that will never report.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from engine.cluster import meta_commands as mc
from engine.cluster.queue_changes import maybe_tombstone
from engine.cluster.records import NODE_MOVES, NODE_STATES, NodeRecord, NodeState
from engine.cluster.replies import Ok
from engine.errors import Conflict, NotFound, ValidationFailed
from engine.raft.state_machine import ApplyMeta

if TYPE_CHECKING:
    from engine.cluster.meta_machine import MetaMachine, Touched


def on_bootstrap(m: MetaMachine, meta: ApplyMeta, cmd: mc.Bootstrap, touched: Touched) -> object:
    if not cmd.cluster_id:
        raise ValidationFailed("a cluster id is not empty")
    if m.cluster_id == cmd.cluster_id:
        return Ok(False)
    if m.cluster_id:
        raise Conflict(f"this is cluster {m.cluster_id}, not {cmd.cluster_id}")
    m.cluster_id = cmd.cluster_id
    return Ok(True)


def on_add_node(m: MetaMachine, meta: ApplyMeta, cmd: mc.AddNode, touched: Touched) -> object:
    if not cmd.name or not cmd.address:
        raise ValidationFailed("a node has a name and an address")
    known = m.nodes.get(cmd.name)
    if known is not None and known.state != "forgotten":
        if known.address != cmd.address:
            raise Conflict(f"node {cmd.name} is known at {known.address}")
        return Ok(False)
    if known is None and len(m.nodes) >= m.limits.cluster_nodes_max:
        _make_room(m, touched)
    m.nodes[cmd.name] = NodeRecord(cmd.name, cmd.address, "active", meta.index, meta.index)
    touched.nodes.add(cmd.name)
    return Ok(True)


def on_set_node_state(
    m: MetaMachine, meta: ApplyMeta, cmd: mc.SetNodeState, touched: Touched
) -> object:
    if cmd.state not in NODE_STATES:
        raise ValidationFailed(f"a node state is one of {', '.join(NODE_STATES)}")
    state: NodeState = cmd.state
    known = m.nodes.get(cmd.name)
    if known is None:
        raise NotFound(f"no node {cmd.name}")
    if known.state == state:
        return Ok(False)
    if state not in NODE_MOVES[known.state]:
        raise Conflict(f"node {cmd.name} is {known.state}: it cannot become {state}")
    if state == "forgotten":
        _check_forgettable(m, cmd.name)
    m.nodes[cmd.name] = dataclasses.replace(known, state=state, state_index=meta.index)
    touched.nodes.add(cmd.name)
    if state == "forgotten":
        _count_as_dropped(m, cmd.name, meta.index, touched)
    return Ok(True)


def on_node_started(
    m: MetaMachine, meta: ApplyMeta, cmd: mc.NodeStarted, touched: Touched
) -> object:
    """Record the data directory a node runs from: once, so that a node that comes back
    from another one (it lost its data) is told apart from one that never started."""
    if not cmd.incarnation:
        raise ValidationFailed("an incarnation is not empty")
    known = m.nodes.get(cmd.name)
    if known is None or known.state == "forgotten":
        raise NotFound(f"no node {cmd.name}")
    if known.incarnation == cmd.incarnation:
        return Ok(False)
    if known.incarnation:
        raise Conflict(f"node {cmd.name} started already, from another data directory")
    m.nodes[cmd.name] = dataclasses.replace(known, incarnation=cmd.incarnation)
    touched.nodes.add(cmd.name)
    return Ok(True)


def _count_as_dropped(m: MetaMachine, node: str, index: int, touched: Touched) -> None:
    """A forgotten node holds nothing: every queue being deleted stops waiting for it."""
    waiting = [
        q.name
        for q in m.queues.values()
        if q.state == "deleting" and node in q.members and node not in q.dropped
    ]
    for name in sorted(waiting):
        q = m.queues[name]
        dropped = tuple(sorted((*q.dropped, node)))
        maybe_tombstone(m, dataclasses.replace(q, dropped=dropped), index, touched)


def _make_room(m: MetaMachine, touched: Touched) -> None:
    """At the limit, a new node takes the place of the node forgotten longest ago (no
    creating or live queue names a forgotten node)."""
    forgotten = sorted((n.state_index, n.name) for n in m.nodes.values() if n.state == "forgotten")
    if not forgotten:
        raise ValidationFailed(f"the cluster holds at most {m.limits.cluster_nodes_max} nodes")
    _index, name = forgotten[0]
    del m.nodes[name]
    touched.nodes.add(name)


def _check_forgettable(m: MetaMachine, node: str) -> None:
    hosting = sorted(
        q.name for q in m.queues.values() if q.state in ("creating", "live") and node in q.members
    )
    if hosting:
        shown = ", ".join(hosting[:5]) + (", ..." if len(hosting) > 5 else "")
        raise Conflict(
            f"node {node} still holds replicas of {len(hosting)} queues ({shown}): "
            "replace them first"
        )


__all__ = ["on_add_node", "on_bootstrap", "on_node_started", "on_set_node_state"]
