"""engine.cluster: the cluster's metadata as a pure replicated machine, where replicas go,
and how a node's replicas are reconciled with it (see engine/__init__.py for the layering).

Pure like ``engine.raft`` and ``engine.queue``: no clock, randomness or I/O.

How the runtime uses it
-----------------------
* **Host** one ``MetaMachine(limits)`` as the machine of the metadata Raft group (up to
  five voters), like a queue's machine. Propose ``encode_command(cmd)`` for each command
  of ``engine.cluster.meta_commands``; the first is ``Bootstrap(cluster_id)``, then
  ``AddNode(name, address)`` for every node. Replies: ``Ok(changed)``,
  ``QueueCreated(uid, members, leader)``, ``QueueExists(uid)``, ``QueueDeleting(uid)``,
  ``MembersChanged(uid, members, generation)``, or ``Rejected(error_class, detail)``
  (``reply.to_error()`` gives the exception to raise).
* **Mirror into SQLite**: every replica performs ``MetaChanged(index, nodes, queues,
  users, tokens)``: upsert those rows from ``machine.nodes/queues/users/tokens`` (delete
  the row when the key is gone); after installing a snapshot, rewrite every row.
* **Reconcile** after each ``MetaChanged`` naming queues or nodes, and on a timer:
  ``reconcile.plan(node, machine.hosted_by(node), local)`` where ``local`` maps each uid
  this node holds to ``"hosted"`` or ``"broken"``; run the actions in order
  (``CreateReplica`` with ``bootstrap`` or an empty configuration, ``DeleteReplica``),
  then propose ``reconcile.reports(node, actions)``.
* **Placement and membership**: ``CreateQueue`` places replicas itself
  (``placement.place``). To move a replica, propose ``AddMember(uid, target,
  generation)``, let the queue's leader add the learner and promote it, then
  ``RemoveMember(uid, source, generation + 1)``. ``placement.replacements`` (a lost node)
  and ``placement.drain_plan`` (a draining node) list those moves; forget a node with
  ``SetNodeState(name, "forgotten")`` once it holds no replica.
* **The metadata group's own members** follow the node records: on its leader,
  ``meta_voters.next_change`` names the next Raft change (a joined node added as a
  learner, a learner promoted while there are fewer than five voters, a forgotten member
  removed once silent).
"""

from engine.cluster import meta_commands, meta_voters, placement, reconcile
from engine.cluster.meta_commands import MetaCommand, decode_command, encode_command
from engine.cluster.meta_machine import MetaMachine
from engine.cluster.records import NodeRecord, QueueRecord, TokenRecord, UserRecord
from engine.cluster.replies import (
    MembersChanged,
    MetaChanged,
    Ok,
    QueueCreated,
    QueueDeleting,
    QueueExists,
)

__all__ = [
    "MembersChanged",
    "MetaChanged",
    "MetaCommand",
    "MetaMachine",
    "NodeRecord",
    "Ok",
    "QueueCreated",
    "QueueDeleting",
    "QueueExists",
    "QueueRecord",
    "TokenRecord",
    "UserRecord",
    "decode_command",
    "encode_command",
    "meta_commands",
    "meta_voters",
    "placement",
    "reconcile",
]
