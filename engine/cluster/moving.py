"""Moving a queue's replicas off draining and lost nodes: the next change, chosen purely.

Rule of this module: ``next_step`` looks at one queue as its Raft leader sees it (the
metadata's record and the group's voters and learners) and names the one change to make
next, or None; the runtime makes it, and asks again once it is done (or failed, or the
node crashed half-way). So one change at a time per queue, and every interrupted move
is finished or undone from what the metadata and the group say, never from memory:

* first the leftovers of an interrupted change: a learner of the group (an addition whose
  catch-up no leader runs any more) is removed; a member the metadata places and the
  group lacks is added when its node is active and reachable, else unplaced (so that a
  target that went down does not hold the move up: another is chosen);
* then, if a member's node is ``draining`` or ``lost`` (the leaving members): a leader on
  a draining node hands its leadership to the reachable active voter preferred as leader
  (fewest queues); otherwise, while the queue has fewer active members than its
  ``replicas`` and ``placement.replacements`` finds a reachable active node for the first
  leaving member, that node is added (a learner that catches up and becomes a voter); then the leaving member is
  removed. A draining node's replica that no node can take stays (the drain waits for a
  node to join); a lost node's is removed all the same, as long as another member stays:
  it is dead weight in the group's quorum.

Only ``creating`` and ``live`` queues move; a queue being deleted is dropped instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from engine.cluster.placement import loads, pick_leader, replacements
from engine.cluster.records import NodeRecord, NodeState, QueueRecord

LEAVING: tuple[NodeState, ...] = ("draining", "lost")


@dataclass(frozen=True, slots=True)
class TransferLeader:
    target: str


@dataclass(frozen=True, slots=True)
class AddReplica:
    """Place (if not yet) and add ``target`` to the group, as ``POST .../members`` does."""

    target: str


@dataclass(frozen=True, slots=True)
class RemoveReplica:
    """Remove ``source`` from the group (if it is in it), unplace it, delete its replica."""

    source: str
    reason: str


Step = TransferLeader | AddReplica | RemoveReplica


@dataclass(frozen=True, slots=True)
class GroupView:
    """The queue's group as its leader on ``here`` sees it: node names."""

    here: str
    voters: tuple[str, ...]
    learners: tuple[str, ...]
    busy: bool
    """A membership change or a catch-up runs on the leader now: wait for it."""
    down: tuple[str, ...] = ()
    """Nodes the leader's transport cannot reach now: no replica or leadership goes there."""


def state_of(nodes: Mapping[str, NodeRecord], name: str) -> NodeState:
    rec = nodes.get(name)
    return "forgotten" if rec is None else rec.state


def leaving(nodes: Mapping[str, NodeRecord], rec: QueueRecord) -> list[str]:
    """The members of ``rec`` on draining or lost nodes, lost ones first, then by name."""
    gone = [m for m in rec.members if state_of(nodes, m) in LEAVING]
    return sorted(gone, key=lambda m: (state_of(nodes, m) != "lost", m))


def next_step(
    nodes: Mapping[str, NodeRecord],
    queues: Iterable[QueueRecord],
    rec: QueueRecord,
    group: GroupView,
) -> Step | None:
    """The next change of ``rec``'s group (see the module's rule), or None."""
    if rec.state not in ("creating", "live") or group.busy:
        return None
    leftover = _leftover(nodes, rec, group)
    if leftover is not None:
        return leftover
    going = leaving(nodes, rec)
    if not going:
        return None
    if state_of(nodes, group.here) == "draining":
        others = [v for v in group.voters if v != group.here and _usable(nodes, group, v)]
        if others:
            return TransferLeader(pick_leader(others, loads(queues).leaders, rec.name))
    source = going[0]
    active = [m for m in rec.members if state_of(nodes, m) == "active"]
    if len(active) < rec.replicas:
        reachable = {n: r for n, r in nodes.items() if n not in group.down}
        moves = [m for m in replacements(reachable, queues, source) if m.uid == rec.uid]
        if moves and moves[0].target is not None:
            return AddReplica(moves[0].target)
        if state_of(nodes, source) == "draining" or not active:
            return None  # nowhere to go: the replica stays until a node can take it
    if source == group.here:
        return None  # the leader is the last to leave: another member leads first
    return RemoveReplica(source, f"its node is {state_of(nodes, source)}")


def _leftover(nodes: Mapping[str, NodeRecord], rec: QueueRecord, group: GroupView) -> Step | None:
    for learner in group.learners:
        return RemoveReplica(learner, "a learner whose addition was interrupted")
    in_group = set(group.voters)
    for member in rec.members:
        if member in in_group:
            continue
        if _usable(nodes, group, member):
            return AddReplica(member)
        return RemoveReplica(member, "placed, never added, and its node is leaving or down")
    return None


def _usable(nodes: Mapping[str, NodeRecord], group: GroupView, name: str) -> bool:
    return state_of(nodes, name) == "active" and name not in group.down


def holding(queues: Iterable[QueueRecord], node: str) -> list[str]:
    """The creating or live queues that still place a replica on ``node``, by name."""
    return sorted(q.name for q in queues if q.state in ("creating", "live") and node in q.members)


__all__ = [
    "LEAVING",
    "AddReplica",
    "GroupView",
    "RemoveReplica",
    "Step",
    "TransferLeader",
    "holding",
    "leaving",
    "next_step",
    "state_of",
]
