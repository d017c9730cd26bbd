"""Who replicates the metadata group: its next membership change, from its nodes.

Rule of this module: every node the metadata records, except forgotten ones, holds a
replica of the metadata group; at most ``Limits.meta_voters_max`` of them vote, the
others are learners (they apply the log, so they serve and reconcile like any node, but
count for no quorum). The metadata group's leader asks ``next_change`` for one change at
a time (Raft changes one server at a time) and makes it; once it committed it asks
again, until the answer is ``None``. In order:

1. a member whose node is forgotten is removed once the leader no longer hears from it
   (never the leader itself: the next leader removes it), so that a forgotten voter does
   not weigh on the quorum. A forgotten node that is up hears of it through the group,
   then stops; removing it first would leave it serving, never told;
2. an active node that is no member joins as a learner (the oldest joiner first);
3. while there are fewer voters than the limit, the active learner that joined first
   is promoted (it catches up first), which also replaces a removed voter;
4. a draining voter hands its vote over, so that the group keeps its number of voters:
   while it votes, an active learner is promoted (up to one voter beyond the limit),
   and once there are more voters than the limit, the draining voter is demoted to a
   learner (it still applies the metadata: a draining node serves on). The leader does
   not demote itself: it transfers its leadership to an active voter it hears first.
   With no active learner (every node votes already) the draining voter keeps its vote:
   fewer voters would tolerate fewer failures.

Only active nodes join or are promoted: a draining node is on its way out, and a lost
one could not catch up. A demoted node that is activated again stays a learner while
the voters are at the limit (nothing moves back by itself). Pure: the configuration is
given as node names.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from engine.cluster.records import NodeRecord

ChangeKind = Literal["remove", "add_learner", "promote", "demote", "transfer"]


@dataclass(frozen=True, slots=True)
class VoterChange:
    kind: ChangeKind
    node: str


def next_change(
    nodes: Mapping[str, NodeRecord],
    voters: Collection[str],
    learners: Collection[str],
    leader: str,
    voters_max: int,
    heard: Collection[str],
) -> VoterChange | None:
    """The next change of the metadata group's members (see the module's rule);
    ``heard``: the members the leader heard from lately."""
    members = set(voters) | set(learners)
    for name in sorted(members):
        rec = nodes.get(name)
        gone = rec is not None and rec.state == "forgotten"
        if gone and name != leader and name not in heard:
            return VoterChange("remove", name)
    joiners = _by_joining(
        n for n in nodes.values() if n.state == "active" and n.name not in members
    )
    if joiners:
        return VoterChange("add_learner", joiners[0])
    ready = _by_joining(
        nodes[name] for name in learners if name in nodes and nodes[name].state == "active"
    )
    draining = sorted(v for v in voters if v in nodes and nodes[v].state == "draining")
    if ready and (len(voters) < voters_max or (draining and len(voters) <= voters_max)):
        return VoterChange("promote", ready[0])
    if draining and len(voters) > voters_max:
        others = [d for d in draining if d != leader]
        if others:
            return VoterChange("demote", others[0])
        targets = sorted(
            v for v in voters if v in heard and v in nodes and nodes[v].state == "active"
        )
        if targets:
            return VoterChange("transfer", targets[0])
    return None


def _by_joining(records: Iterable[NodeRecord]) -> list[str]:
    return [r.name for r in sorted(records, key=lambda r: (r.joined_index, r.name))]


__all__ = ["ChangeKind", "VoterChange", "next_change"]
