"""Queue definitions in the metadata: create, delete, policy, placement, replica reports.

Rule of this module: a name has at most one queue that is not a tombstone. Create is
idempotent (the same name and arguments answer ``QueueExists`` with the uid), assigns
the uid from the entry's index (no randomness: every replica derives the same one) and
places the replicas (``engine.cluster.placement``). A queue is live once a majority of its
members reported their replica created (the group can then elect a leader); deleting
waits for every member to report its replica dropped, then the queue is a tombstone and
its name free again. Members change one at a time: ``AddMember``/``RemoveMember`` name
the generation they were computed against, and a stale one is refused.

Every handler checks first and changes after, so a refused command changes nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import TYPE_CHECKING

from engine.cluster import meta_commands as mc
from engine.cluster.placement import loads, pick_leader, place
from engine.cluster.records import QUEUE_STATES, QueueRecord
from engine.cluster.replies import MembersChanged, Ok, QueueCreated, QueueDeleting, QueueExists
from engine.errors import Conflict, QueueConflict, QueueNotFound, ValidationFailed
from engine.queue import QueuePolicy
from engine.raft.state_machine import ApplyMeta

if TYPE_CHECKING:
    from engine.cluster.meta_machine import MetaMachine, Touched

UID_CHARS = 32


def queue_uid(cluster_id: str, index: int) -> str:
    """32 hex characters, like the uids single nodes made before: the creating entry's
    index (unique in the cluster's log, and sorting by creation), then a digest of the
    cluster id, so that two clusters' queue directories never share a name."""
    tag = hashlib.sha256(cluster_id.encode()).hexdigest()[:16]
    return f"{index:016x}{tag}"


def on_create_queue(
    m: MetaMachine, meta: ApplyMeta, cmd: mc.CreateQueue, touched: Touched
) -> object:
    _check_name(cmd.name, "queue name")
    _check_policy(m, cmd.policy)
    existing = m.queues.get(cmd.name)
    if existing is not None and existing.state in ("creating", "live"):
        if (existing.replicas, existing.policy) != (cmd.replicas, cmd.policy):
            raise QueueConflict(f"queue {cmd.name} exists with other arguments")
        return QueueExists(existing.uid)
    if existing is not None and existing.state == "deleting":
        raise QueueConflict(f"queue {cmd.name} is being deleted: retry once it is gone")
    if m.live_queue_count() >= m.limits.cluster_queues_max:
        raise ValidationFailed(f"the cluster holds at most {m.limits.cluster_queues_max} queues")
    placement = place(m.nodes, m.queues.values(), cmd.replicas, cmd.name)
    if placement is None:
        active = sum(1 for n in m.nodes.values() if n.state == "active")
        raise ValidationFailed(f"replicas must be 1..{active} (active nodes in the cluster)")
    uid = queue_uid(m.cluster_id, meta.index)
    assert uid not in m.uids, uid
    if existing is not None:  # a tombstone: the name is reused
        _forget(m, existing)
    record = QueueRecord(
        name=cmd.name,
        uid=uid,
        replicas=cmd.replicas,
        policy=cmd.policy,
        state="creating",
        members=placement.members,
        leader=placement.leader,
        generation=1,
        bootstrap=placement.members,
        founders=placement.members,
        created=(),
        dropped=(),
        created_at_ms=meta.now_ms,
        created_index=meta.index,
    )
    _store(m, record, touched)
    return QueueCreated(uid, record.members, record.leader)


def on_delete_queue(
    m: MetaMachine, meta: ApplyMeta, cmd: mc.DeleteQueue, touched: Touched
) -> object:
    rec = m.queues.get(cmd.name)
    if rec is None or rec.state == "tombstone" or cmd.uid not in ("", rec.uid):
        raise QueueNotFound(f"no queue {cmd.name}")
    if rec.state == "deleting":
        return QueueDeleting(rec.uid)
    rec = dataclasses.replace(rec, state="deleting", deleting_index=meta.index)
    _store(m, rec, touched)
    return QueueDeleting(rec.uid)


def on_set_queue_policy(
    m: MetaMachine, meta: ApplyMeta, cmd: mc.SetQueuePolicy, touched: Touched
) -> object:
    rec = _existing(m, cmd.uid)
    _check_policy(m, cmd.policy)
    if cmd.policy.priorities != rec.policy.priorities:
        raise ValidationFailed("priorities is fixed when the queue is created")
    if cmd.policy == rec.policy:
        return Ok(False)
    first = rec.created_policy
    _store(m, dataclasses.replace(rec, policy=cmd.policy, first_policy=first), touched)
    return Ok(True)


def on_set_queue_leader(
    m: MetaMachine, meta: ApplyMeta, cmd: mc.SetQueueLeader, touched: Touched
) -> object:
    rec = _existing(m, cmd.uid)
    if cmd.node not in rec.members:
        raise QueueNotFound(f"queue {rec.name} has no replica on {cmd.node}")
    if cmd.node == rec.leader:
        return Ok(False)
    _store(m, dataclasses.replace(rec, leader=cmd.node), touched)
    return Ok(True)


def on_add_member(m: MetaMachine, meta: ApplyMeta, cmd: mc.AddMember, touched: Touched) -> object:
    rec = _existing(m, cmd.uid)
    _check_generation(rec, cmd.generation)
    node = m.nodes.get(cmd.node)
    if node is None or node.state != "active":
        raise ValidationFailed(f"{cmd.node} is not an active node of this cluster")
    if cmd.node in rec.members:
        raise QueueConflict(f"queue {rec.name} already has a replica on {cmd.node}")
    members = tuple(sorted((*rec.members, cmd.node)))
    rec = dataclasses.replace(rec, members=members, generation=rec.generation + 1)
    _store(m, rec, touched)
    return MembersChanged(rec.uid, rec.members, rec.generation)


def on_remove_member(
    m: MetaMachine, meta: ApplyMeta, cmd: mc.RemoveMember, touched: Touched
) -> object:
    rec = _existing(m, cmd.uid)
    _check_generation(rec, cmd.generation)
    if cmd.node not in rec.members:
        raise QueueNotFound(f"queue {rec.name} has no replica on {cmd.node}")
    if len(rec.members) == 1:
        raise QueueConflict(f"queue {rec.name} has one replica: delete the queue instead")
    rec = dataclasses.replace(
        rec,
        members=_without(rec.members, cmd.node),
        created=_without(rec.created, cmd.node),
        founders=_without(rec.founders, cmd.node),
        generation=rec.generation + 1,
    )
    if rec.leader == cmd.node:
        leaders = loads(m.queues.values()).leaders
        rec = dataclasses.replace(rec, leader=pick_leader(rec.members, leaders, rec.name))
    _store(m, _maybe_live(rec, meta.index), touched)
    return MembersChanged(rec.uid, rec.members, rec.generation)


def on_replica_created(
    m: MetaMachine, meta: ApplyMeta, cmd: mc.ReplicaCreated, touched: Touched
) -> object:
    rec = _known(m, cmd.uid)
    if rec.state in ("deleting", "tombstone"):
        return Ok(False)
    if cmd.node not in rec.members:
        raise Conflict(f"{cmd.node} holds no replica of queue {rec.name} any more")
    if cmd.node in rec.created:
        return Ok(False)
    rec = dataclasses.replace(rec, created=tuple(sorted((*rec.created, cmd.node))))
    _store(m, _maybe_live(rec, meta.index), touched)
    return Ok(True)


def on_replica_dropped(
    m: MetaMachine, meta: ApplyMeta, cmd: mc.ReplicaDropped, touched: Touched
) -> object:
    rec = _known(m, cmd.uid)
    if rec.state == "tombstone" or cmd.node not in rec.members or cmd.node in rec.dropped:
        return Ok(False)  # a removed member's zombie, or said before
    if rec.state != "deleting":
        raise QueueConflict(f"queue {rec.name} is not being deleted")
    rec = dataclasses.replace(rec, dropped=tuple(sorted((*rec.dropped, cmd.node))))
    maybe_tombstone(m, rec, meta.index, touched)
    return Ok(True)


# --- shared with the node handlers ----------------------------------------------------


def maybe_tombstone(m: MetaMachine, rec: QueueRecord, index: int, touched: Touched) -> None:
    """Store ``rec`` (deleting), a tombstone once every member dropped its replica; the
    oldest tombstones beyond the limit are forgotten."""
    if set(rec.members) <= set(rec.dropped):
        rec = dataclasses.replace(rec, state="tombstone", tombstone_index=index)
        m.tombstones[rec.name] = index
    _store(m, rec, touched)
    while len(m.tombstones) > m.limits.cluster_tombstones_max:
        oldest = next(iter(m.tombstones))
        _forget(m, m.queues[oldest])
        touched.queues.add(oldest)


def check_record(m: MetaMachine, q: QueueRecord) -> None:
    assert m.uids.get(q.uid) == q.name and q.state in QUEUE_STATES
    for names in (q.members, q.bootstrap, q.founders, q.created, q.dropped):
        assert list(names) == sorted(set(names)), q
    assert q.members and set(q.created) <= set(q.members) and set(q.dropped) <= set(q.members)
    assert set(q.founders) <= set(q.bootstrap) and q.leader in (*q.members, "")
    assert q.generation >= 1 and q.created_index >= 1
    indexes = {
        "creating": (q.live_index == 0 and q.deleting_index == 0),
        "live": q.live_index > 0 and q.deleting_index == 0,
        "deleting": q.deleting_index > 0 and q.tombstone_index == 0,
        "tombstone": 0 < q.deleting_index <= q.tombstone_index,
    }
    assert indexes[q.state], q
    assert q.state in ("deleting", "tombstone") or not q.dropped, q
    assert q.state != "creating" or 2 * len(q.created) <= len(q.members), q
    if q.state in ("creating", "live"):
        for name in q.members:
            node = m.nodes.get(name)
            assert node is not None and node.state != "forgotten", (q, name)


# --- helpers --------------------------------------------------------------------------


def _store(m: MetaMachine, rec: QueueRecord, touched: Touched) -> None:
    m.queues[rec.name] = rec
    m.uids[rec.uid] = rec.name
    touched.queues.add(rec.name)


def _forget(m: MetaMachine, rec: QueueRecord) -> None:
    assert rec.state == "tombstone"
    del m.queues[rec.name]
    del m.uids[rec.uid]
    del m.tombstones[rec.name]


def _maybe_live(rec: QueueRecord, index: int) -> QueueRecord:
    """Live once a majority of the members hold their replica: the group can elect."""
    if rec.state == "creating" and 2 * len(rec.created) > len(rec.members):
        return dataclasses.replace(rec, state="live", live_index=index)
    return rec


def _known(m: MetaMachine, uid: str) -> QueueRecord:
    rec = m.queue_by_uid(uid)
    if rec is None:
        raise QueueNotFound(f"no queue with uid {uid}")
    return rec


def _existing(m: MetaMachine, uid: str) -> QueueRecord:
    """The creating or live queue ``uid``."""
    rec = _known(m, uid)
    if rec.state not in ("creating", "live"):
        raise QueueConflict(f"queue {rec.name} is {rec.state}")
    return rec


def _check_generation(rec: QueueRecord, generation: int) -> None:
    if generation != rec.generation:
        raise Conflict(
            f"queue {rec.name}: members changed (generation {rec.generation}, "
            f"not {generation}): read them again"
        )


def _check_policy(m: MetaMachine, policy: QueuePolicy) -> None:
    limits = m.limits
    why = policy.check(limits.lease_ms_max, limits.priorities_max, limits.message_bytes_max_ceiling)
    if why:
        raise ValidationFailed(why)


def _check_name(name: str, what: str) -> None:
    if not name:
        raise ValidationFailed(f"a {what} is not empty")


def _without(names: tuple[str, ...], name: str) -> tuple[str, ...]:
    return tuple(n for n in names if n != name)


__all__ = [
    "UID_CHARS",
    "check_record",
    "maybe_tombstone",
    "on_add_member",
    "on_create_queue",
    "on_delete_queue",
    "on_remove_member",
    "on_replica_created",
    "on_replica_dropped",
    "on_set_queue_leader",
    "on_set_queue_policy",
    "queue_uid",
]
