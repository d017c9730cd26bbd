"""Whether a node the metadata already records may join again (``--join`` once more).

Rule: a node's ``--join`` is sent only on its first start, from an empty data directory
(``app.cluster_identity``); with its data directory kept, a restart never joins again. So
a join under a name the metadata records as a node not forgotten comes either from a node
whose first join committed but whose answer was lost (it crashed before writing its
identity), or from a node that lost its data directory. Both look alike, and the second
is unsafe where the node votes: a voter that comes back with an empty log has forgotten
the entries it acknowledged and the votes it gave, so its vote could elect a leader that
lacks committed entries. Such a join is refused, the node's replicas and its metadata
vote being there to prove the danger; the operator forgets the node first (its replicas
are replaced, it leaves the metadata group) and it then joins as a new node, or restores
its data directory. A node that votes nowhere (it never received a replica, or only
learns the metadata) has nothing to forget: its join is answered as the first one was.

Refusing rather than rejoining as a new incarnation keeps every group's membership
change where it is today, in ``forget`` (one change at a time, replicas replaced before
the node goes): a new incarnation would have to replace the old one's vote in every
group at once, which ``forget`` already does, with the operator's say.

A founding member that lost its data directory and starts again with ``--peers`` does
not join: it forms with the others, from an empty log. Its peers tell it apart from a
founder that never started by the id of the data directory each node reports once it
runs (``NodeStarted``, ``NodeRecord.incarnation``) and names in its handshake: a name
the metadata records as started from another data directory is refused
(``lost_data_refusal``), with the same way out. Pure.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from engine.cluster.records import NodeRecord, QueueRecord

LISTED_QUEUES_MAX = 5
"""Queues named in a refusal; the others are counted."""


def rejoin_refusal(
    nodes: Mapping[str, NodeRecord],
    queues: Mapping[str, QueueRecord],
    meta_voters: Collection[str],
    name: str,
) -> str | None:
    """Why node ``name`` may not join (again) now, or ``None`` if it may (see the
    module's rule); ``meta_voters``: the metadata group's voters."""
    known = nodes.get(name)
    if known is None:
        return None
    if known.state == "forgotten":
        if name not in meta_voters:
            return None
        return (
            f"node {name} was forgotten but still votes in the cluster's metadata (it leaves"
            " once its peers no longer hear from it): try again shortly"
        )
    votes_in: list[str] = []
    if name in meta_voters:
        votes_in.append("the cluster's metadata")
    holding = sorted(
        q.name for q in queues.values() if q.state != "tombstone" and name in q.members
    )
    if holding:
        shown = ", ".join(holding[:LISTED_QUEUES_MAX])
        more = ", ..." if len(holding) > LISTED_QUEUES_MAX else ""
        votes_in.append(f"the replica groups of {len(holding)} queues ({shown}{more})")
    if not votes_in:
        return None
    return (
        f"node {name} is already a member of this cluster and votes in"
        f" {' and in '.join(votes_in)}; joining again without its data would vote with an"
        f" empty log. Restore its data directory, or forget it first"
        f" (POST /api/v1/cluster/nodes/{name}/forget) and then join again"
    )


def lost_data_refusal(nodes: Mapping[str, NodeRecord], name: str, incarnation: str) -> str | None:
    """Why node ``name``, running from data directory ``incarnation``, is refused by its
    peers, or ``None``: the metadata records that it started from another one. A node
    not recorded, forgotten (refused as such) or not started yet is not refused here."""
    known = nodes.get(name)
    if known is None or known.state == "forgotten" or not known.incarnation:
        return None
    if known.incarnation == incarnation:
        return None
    return (
        f"node {name} started before from another data directory, and this one would vote"
        f" with an empty log (was its data directory lost?). Restore its data directory,"
        f" or forget it (POST /api/v1/cluster/nodes/{name}/forget) and start it again"
        f" from an empty data directory with --join"
    )


__all__ = ["LISTED_QUEUES_MAX", "lost_data_refusal", "rejoin_refusal"]
