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
founder that never started by the id of the data directory each node names in its
handshake (authenticated by the cluster secret) and the metadata records
(``NodeStarted``, ``NodeRecord.incarnation``): a name the metadata records as started
from another data directory is refused (``lost_data_refusal``), with the same way out.
The metadata records it as early as it can: the first leader records its own and those
of the founders it heard in a handshake with the formation itself (``started_reports``),
any leader those it hears later (at its next reconcile pass), and each node its own
from its reconcile pass. Until the metadata records a founder, its peers go by what they
heard (``heard_refusal``): a founder sends a vote or an acknowledgement only over a
connection whose handshake named its data directory to the peer it sends to, so a
founder that voted or acknowledged anything was heard from its data directory by that
peer, which refuses it from another one. What stays open: that peer restarted in between
too (what it heard is in its memory only, until the metadata records it: one pass, about
a second). A founder that lost its data directory before any peer heard it sent nothing
to anyone: taking it for one that never started is then right. Pure.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from engine.cluster import meta_commands as mc
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


def heard_refusal(
    nodes: Mapping[str, NodeRecord],
    heard: Mapping[str, str],
    founders: Collection[str],
    name: str,
    incarnation: str,
) -> str | None:
    """Why founder ``name``, running from data directory ``incarnation``, is refused by a
    peer that heard it since it started from another one (``heard``: node -> the data
    directory its last accepted handshake named), while the metadata records neither
    (see the module's rule); ``None`` for a node that is not a founder (a join that
    crashed before it wrote its identity comes again from a new directory, rightly), or
    one the metadata records as forgotten or started (``lost_data_refusal`` decides)."""
    before = heard.get(name)
    if name not in founders or not before or not incarnation or before == incarnation:
        return None
    known = nodes.get(name)
    if known is not None and (known.state == "forgotten" or known.incarnation):
        return None
    return (
        f"node {name} ran from another data directory since this peer started, and this"
        f" one would vote with an empty log (was its data directory lost?). Restore its"
        f" data directory, or forget it (POST /api/v1/cluster/nodes/{name}/forget) and"
        f" start it again from an empty data directory with --join"
    )


def started_reports(
    nodes: Mapping[str, NodeRecord], heard: Mapping[str, str], adding: Collection[str] = ()
) -> list[mc.NodeStarted]:
    """``NodeStarted`` for each node of ``heard`` (node -> the data directory it runs
    from, as its handshake named it) that the metadata records, or is adding now
    (``adding``), without one: the nodes the metadata will recognise if they come back
    from another data directory (see the module's rule)."""

    def unrecorded(name: str) -> bool:
        known = nodes.get(name)
        if known is None:
            return name in adding
        return known.state != "forgotten" and not known.incarnation

    return [
        mc.NodeStarted(name, incarnation)
        for name, incarnation in sorted(heard.items())
        if incarnation and unrecorded(name)
    ]


__all__ = [
    "LISTED_QUEUES_MAX",
    "heard_refusal",
    "lost_data_refusal",
    "rejoin_refusal",
    "started_reports",
]
