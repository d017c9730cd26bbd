"""Where replicas go: pure choices over the metadata's nodes and queues.

Rule of this module: only ``active`` nodes receive replicas; a queue never has two
replicas on one node; the least-loaded node (replicas it should host) wins, and ties are
broken by a hash of the queue name and the node name (SHA-256, the same on every
machine; never Python's ``hash``), so that queues created one after another spread their
replicas and their leaders over the nodes instead of piling onto the first name. Every
function returns the same answer for the same records whatever order they come in.

Loads count the members of every queue that is not a tombstone: a deleting queue's
replicas still take room until they are dropped.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from engine.cluster.records import NodeRecord, QueueRecord


@dataclass(frozen=True, slots=True)
class Placement:
    members: tuple[str, ...]
    """Sorted."""
    leader: str


@dataclass(frozen=True, slots=True)
class Move:
    """Move ``queue``'s replica from ``source`` to ``target`` (None: no active node can
    take it). The runtime adds ``target`` (``AddMember`` at ``generation``), waits for its
    replica to catch up, then removes ``source`` (``RemoveMember`` at the next one)."""

    queue: str
    uid: str
    generation: int
    source: str
    target: str | None


@dataclass(frozen=True, slots=True)
class LeaderMove:
    queue: str
    uid: str
    source: str
    target: str


@dataclass(frozen=True, slots=True)
class DrainPlan:
    """Leaders first (cheap, no data moves), then replicas."""

    leaders: tuple[LeaderMove, ...]
    moves: tuple[Move, ...]


@dataclass(slots=True)
class Loads:
    replicas: Counter[str]
    leaders: Counter[str]


def loads(queues: Iterable[QueueRecord]) -> Loads:
    """Replicas and preferred leaders per node, over the queues that are not tombstones."""
    replicas: Counter[str] = Counter()
    leaders: Counter[str] = Counter()
    for q in queues:
        if q.state == "tombstone":
            continue
        replicas.update(q.members)
        if q.leader:
            leaders[q.leader] += 1
    return Loads(replicas, leaders)


def tiebreak(seed_key: str, node: str) -> bytes:
    return hashlib.sha256(f"{seed_key}\x00{node}".encode()).digest()[:8]


def active_nodes(nodes: Mapping[str, NodeRecord]) -> list[str]:
    return sorted(name for name, rec in nodes.items() if rec.state == "active")


def place(
    nodes: Mapping[str, NodeRecord],
    queues: Iterable[QueueRecord],
    replicas: int,
    seed_key: str,
) -> Placement | None:
    """``replicas`` members on the least-loaded active nodes, and which of them should
    lead; None when fewer active nodes than ``replicas`` (or ``replicas`` < 1)."""
    active = active_nodes(nodes)
    if not 1 <= replicas <= len(active):
        return None
    load = loads(queues)
    ranked = sorted(active, key=lambda n: (load.replicas[n], tiebreak(seed_key, n), n))
    members = tuple(sorted(ranked[:replicas]))
    return Placement(members, pick_leader(members, load.leaders, seed_key))


def pick_leader(candidates: Iterable[str], leaders: Mapping[str, int], seed_key: str) -> str:
    """The candidate preferred as leader by the fewest queues (ties by hash); "" if none."""
    ranked = sorted(candidates, key=lambda n: (leaders.get(n, 0), tiebreak(seed_key, n), n))
    return ranked[0] if ranked else ""


def replacements(
    nodes: Mapping[str, NodeRecord], queues: Iterable[QueueRecord], node: str
) -> tuple[Move, ...]:
    """A new home for each replica ``node`` should host (creating and live queues, by
    name), on the least-loaded active nodes, counting the moves already chosen."""
    ordered = sorted(queues, key=lambda q: q.name)
    load = loads(ordered).replicas
    active = active_nodes(nodes)
    moves: list[Move] = []
    for q in ordered:
        if q.state not in ("creating", "live") or node not in q.members:
            continue
        free = [n for n in active if n not in q.members]
        target = min(free, key=lambda n: (load[n], tiebreak(q.name, n), n)) if free else None
        if target is not None:
            load[target] += 1
            load[node] -= 1
        moves.append(Move(q.name, q.uid, q.generation, node, target))
    return tuple(moves)


def drain_plan(
    nodes: Mapping[str, NodeRecord], queues: Iterable[QueueRecord], node: str
) -> DrainPlan:
    """Move every leadership and then every replica off ``node`` (which the operator set
    ``draining``, so no choice lands on it). A queue with no other member keeps its
    leader until its replica moves."""
    ordered = sorted(queues, key=lambda q: q.name)
    leaders = loads(ordered).leaders
    leader_moves: list[LeaderMove] = []
    for q in ordered:
        if q.state not in ("creating", "live") or q.leader != node:
            continue
        others = [n for n in q.members if n != node and _active(nodes, n)]
        target = pick_leader(others, leaders, q.name)
        if target:
            leaders[target] += 1
            leaders[node] -= 1
            leader_moves.append(LeaderMove(q.name, q.uid, node, target))
    return DrainPlan(tuple(leader_moves), replacements(nodes, ordered, node))


def _active(nodes: Mapping[str, NodeRecord], name: str) -> bool:
    rec = nodes.get(name)
    return rec is not None and rec.state == "active"


__all__ = [
    "DrainPlan",
    "LeaderMove",
    "Loads",
    "Move",
    "Placement",
    "active_nodes",
    "drain_plan",
    "loads",
    "pick_leader",
    "place",
    "replacements",
    "tiebreak",
]
