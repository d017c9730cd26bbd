"""Leadership and membership changes of a queue, and draining and forgetting a node,
shared by the REST API and the dashboard: the engine first, then the audit log (as
``app.queue_admin`` does for queues).

On a single-node cluster there is no other node to add, remove or hand leadership to:
every call answers 409 ``/problems/single-node-cluster`` (after a 404 for no queue).
"""

from __future__ import annotations

from typing import Protocol, cast

from app.db.session import Database
from app.problems import AppProblem
from app.queue_admin import Actor, record_action
from engine.cluster.records import NodeState
from engine.errors import QueueNotFound, ValidationFailed
from engine.runtime.api import QueueEngine, QueueInfo


class SingleNodeCluster(AppProblem):
    status, problem, title = 409, "single-node-cluster", "Single-node cluster"


class ClusterChanges(Protocol):
    """Offered by ``engine.runtime.Node`` beyond the ``QueueEngine`` protocol."""

    async def add_member(self, name: str, node: str) -> QueueInfo: ...

    async def remove_member(self, name: str, node: str) -> QueueInfo: ...

    async def transfer_leadership(self, name: str, node: str) -> None: ...

    async def set_node_state(self, node: str, state: NodeState) -> dict[str, object]: ...


def cluster_changes(node: QueueEngine, name: str) -> ClusterChanges:
    """The node's membership calls, or 409 on a single node (after a 404 for no queue)."""
    if all(info.name != name for info in node.queues()):
        raise QueueNotFound(f"no queue {name!r}")
    nodes = node.cluster().get("nodes", [])
    if not isinstance(nodes, list | dict) or len(nodes) <= 1 or not hasattr(node, "add_member"):
        raise SingleNodeCluster(
            "this cluster has one node: there is no other node to add, remove or lead"
        )
    return cast(ClusterChanges, node)


def transfer_target(node: QueueEngine, name: str, wanted: str | None) -> str:
    """``wanted``, or the most up-to-date follower of the queue's group."""
    if wanted is not None:
        return wanted
    raft = node.stats(name).get("raft", {})
    members = raft.get("members", []) if isinstance(raft, dict) else []
    followers = [m for m in members if isinstance(m, dict) and m.get("role") == "follower"]
    if not followers:
        raise ValidationFailed(f"queue {name} has no follower to hand leadership to")
    followers.sort(key=lambda m: (m.get("lag") is None, m.get("lag") or 0, str(m.get("node"))))
    return str(followers[0]["node"])


async def transfer_leadership(
    node: QueueEngine, db: Database, actor: Actor, name: str, wanted: str | None
) -> str:
    """Hand the queue's leadership to ``wanted`` (or the most up-to-date follower); returns
    the node that leads once it does (``NoLeader`` when it did not take over in time)."""
    changes = cluster_changes(node, name)
    target = transfer_target(node, name, wanted)
    await changes.transfer_leadership(name, target)
    await record_action(db, actor, "queue.leader", name, node=target)
    return target


async def add_member(
    node: QueueEngine, db: Database, actor: Actor, name: str, member: str
) -> QueueInfo:
    """A replica of the queue on ``member``: a learner that catches up, then a voter."""
    info = await cluster_changes(node, name).add_member(name, member)
    await record_action(db, actor, "queue.member.add", name, node=member)
    return info


async def remove_member(
    node: QueueEngine, db: Database, actor: Actor, name: str, member: str
) -> QueueInfo:
    """The queue's replica on ``member`` removed from its group, then deleted."""
    info = await cluster_changes(node, name).remove_member(name, member)
    await record_action(db, actor, "queue.member.remove", name, node=member)
    return info


def node_changes(node: QueueEngine) -> ClusterChanges:
    """The node's calls on cluster nodes, or 409 on a single node."""
    nodes = node.cluster().get("nodes", [])
    if not isinstance(nodes, list) or len(nodes) <= 1 or not hasattr(node, "set_node_state"):
        raise SingleNodeCluster("this cluster has one node: there is no other node to move to")
    return cast(ClusterChanges, node)


NODE_MOVES: dict[str, NodeState] = {"drain": "draining", "activate": "active", "forget": "lost"}
"""What an operator's verb on a node sets in the metadata. ``drain``: its leaderships and
then its replicas move to active nodes (each queue's leader moves its own, one change at a
time); ``activate``: a draining (or lost, come back) node takes new replicas and
leaderships again, what moved off it stays where it went; ``forget``: declared lost, its
replicas are replaced on active nodes, then it is forgotten (and refused if it comes
back)."""


async def move_node(
    node: QueueEngine, db: Database, actor: Actor, name: str, verb: str
) -> dict[str, object]:
    """Set ``name``'s state for ``verb`` (``NODE_MOVES``) and record the action. Returns the
    node's state and the queues still placed on it."""
    entry = await node_changes(node).set_node_state(name, NODE_MOVES[verb])
    await record_action(db, actor, f"node.{verb}", name)
    return entry


__all__ = [
    "NODE_MOVES",
    "ClusterChanges",
    "SingleNodeCluster",
    "add_member",
    "cluster_changes",
    "move_node",
    "node_changes",
    "remove_member",
    "transfer_leadership",
    "transfer_target",
]
