"""The cluster metadata machine: ``apply(meta, command) -> (reply, effects)``, pure.

Rule of this module: the machine holds the cluster's nodes, queue definitions with their
lifecycle and placement, users, permissions and token digests, and nothing else. Every
command is decoded and checked as it is applied; a bad one answers ``Rejected`` and
changes nothing (each handler checks everything before it changes anything), so the same
log applies identically everywhere and no peer's bytes can raise out of ``apply``. State
is dicts keyed by strings: nothing in a handler depends on their order (they are sorted
wherever they are walked), and the snapshot writes them sorted.

The machine keeps no payloads in its log (``live_indexes`` is empty): it asks for a
checkpoint, and releases the whole log before it, once the commands applied since the
last one weigh about twice what the checkpoint will (as the queue machine does with its
dead bytes), which bounds both the log and the cost of checkpoints.

The handlers live in modules named for what they change: ``engine.cluster.node_changes``,
``engine.cluster.queue_changes``, ``engine.cluster.access_changes``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import msgpack
from pyroaring import BitMap64

from engine.cluster import access_changes, node_changes, queue_changes
from engine.cluster import meta_commands as mc
from engine.cluster.records import (
    NodeRecord,
    QueueRecord,
    TokenRecord,
    UserRecord,
    queue_from_wire,
    record_to_wire,
)
from engine.cluster.replies import MetaChanged, Rejected
from engine.errors import Conflict, QuorraError
from engine.limits import DEFAULT_LIMITS, Limits
from engine.raft.state_machine import ApplyMeta, CheckpointRequest, MachineEffect, ReleaseCursor


class Touched:
    """The keys one entry changed, for its ``MetaChanged`` effect."""

    __slots__ = ("nodes", "queues", "tokens", "users")

    def __init__(self) -> None:
        self.nodes: set[str] = set()
        self.queues: set[str] = set()
        self.users: set[str] = set()
        self.tokens: set[str] = set()

    def effect(self, index: int) -> MetaChanged | None:
        if not (self.nodes or self.queues or self.users or self.tokens):
            return None
        return MetaChanged(
            index,
            tuple(sorted(self.nodes)),
            tuple(sorted(self.queues)),
            tuple(sorted(self.users)),
            tuple(sorted(self.tokens)),
        )


class MetaMachine:
    """The metadata of one cluster, constructed identically on every replica."""

    version: ClassVar[int] = 1

    def __init__(self, limits: Limits = DEFAULT_LIMITS) -> None:
        self.limits = limits
        self._reset()

    def _reset(self) -> None:
        self.cluster_id = ""
        self.nodes: dict[str, NodeRecord] = {}
        self.queues: dict[str, QueueRecord] = {}
        """By name; a tombstone stays until the name is reused or it is the oldest of
        more than ``Limits.cluster_tombstones_max``."""
        self.uids: dict[str, str] = {}
        """Uid -> name, for every record in ``queues``."""
        self.tombstones: dict[str, int] = {}
        """Name -> tombstone index, oldest first."""
        self.users: dict[str, UserRecord] = {}
        self.tokens: dict[str, TokenRecord] = {}
        self.digests: dict[str, str] = {}
        """Token digest -> token id."""
        self.last_index = 0
        self.now_ms = 0
        self.dead_bytes = 0

    # === the Machine contract ======================================================

    def apply(self, meta: ApplyMeta, command: bytes) -> tuple[object, list[MachineEffect]]:
        assert meta.index > self.last_index, (meta.index, self.last_index)
        self.last_index = meta.index
        self.now_ms = max(self.now_ms, meta.now_ms)
        self.dead_bytes += len(command)
        touched = Touched()
        reply: object
        try:
            cmd = mc.decode_command(command)
            if not self.cluster_id and type(cmd) is not mc.Bootstrap:
                raise Conflict("the cluster is not bootstrapped yet")
            reply = _HANDLERS[type(cmd)](self, meta, cmd, touched)
        except QuorraError as e:
            reply = Rejected(type(e), e.detail)
        effects: list[MachineEffect] = []
        changed = touched.effect(meta.index)
        if changed is not None:
            effects.append(changed)
        self._maybe_checkpoint(meta.index, effects)
        return reply, effects

    def live_indexes(self) -> BitMap64:
        return BitMap64()

    def snapshot(self) -> bytes:
        body = [
            self.version,
            self.cluster_id,
            self.last_index,
            self.now_ms,
            self.dead_bytes,
            [record_to_wire(self.nodes[k]) for k in sorted(self.nodes)],
            [record_to_wire(self.queues[k]) for k in sorted(self.queues)],
            [record_to_wire(self.users[k]) for k in sorted(self.users)],
            [record_to_wire(self.tokens[k]) for k in sorted(self.tokens)],
        ]
        return bytes(msgpack.packb(body, use_bin_type=True))

    def restore(self, data: bytes) -> None:
        body: list[Any] = msgpack.unpackb(data, raw=False)
        version, cluster_id, last_index, now_ms, dead_bytes, nodes, queues, users, tokens = body
        assert version == self.version, version
        self._reset()
        self.cluster_id, self.last_index, self.now_ms = cluster_id, last_index, now_ms
        self.dead_bytes = dead_bytes
        self.nodes = {n[0]: NodeRecord(*n) for n in nodes}
        self.queues = {q[0]: queue_from_wire(q) for q in queues}
        self.uids = {q.uid: q.name for q in self.queues.values()}
        gone = sorted(
            (q.tombstone_index, q.name) for q in self.queues.values() if q.tombstone_index
        )
        self.tombstones = {name: index for index, name in gone}
        self.users = {u[0]: UserRecord(*u) for u in users}
        self.tokens = {t[0]: TokenRecord(*t) for t in tokens}
        self.digests = {t.digest: t.id for t in self.tokens.values()}

    # === queries ===================================================================

    def queue_by_uid(self, uid: str) -> QueueRecord | None:
        name = self.uids.get(uid)
        return None if name is None else self.queues[name]

    def hosted_by(self, node: str) -> dict[str, QueueRecord]:
        """Uid -> record of every queue, not a tombstone, that places a replica on
        ``node``: what its reconcile loop compares with the replicas it holds."""
        held = [q for q in self.queues.values() if q.state != "tombstone" and node in q.members]
        return {q.uid: q for q in sorted(held, key=lambda q: q.uid)}

    def token_by_digest(self, digest: str) -> TokenRecord | None:
        token_id = self.digests.get(digest)
        return None if token_id is None else self.tokens[token_id]

    def live_queue_count(self) -> int:
        return len(self.queues) - len(self.tombstones)

    def check_invariants(self) -> None:
        """The indexes agree with the records; the tests and the simulator call it."""
        assert self.uids == {q.uid: q.name for q in self.queues.values()}
        assert list(self.tombstones) == [
            name
            for _i, name in sorted((q.tombstone_index, n) for n, q in self.queues.items())
            if self.queues[name].state == "tombstone"
        ], "tombstones are listed exactly, oldest first"
        assert len(self.tombstones) <= self.limits.cluster_tombstones_max
        assert self.digests == {t.digest: t.id for t in self.tokens.values()}
        assert all(t.user in self.users for t in self.tokens.values())
        for name, q in self.queues.items():
            assert name == q.name
            queue_changes.check_record(self, q)

    # === bookkeeping ===============================================================

    def _maybe_checkpoint(self, index: int, effects: list[MachineEffect]) -> None:
        limits = self.limits
        records = len(self.nodes) + len(self.queues) + len(self.users) + len(self.tokens)
        estimate = max(
            records * limits.meta_record_bytes_estimate, limits.meta_checkpoint_bytes_min
        )
        if self.dead_bytes < limits.dead_bytes_per_live_checkpoint_factor * estimate:
            return
        self.dead_bytes = 0
        effects.append(CheckpointRequest(index))
        effects.append(ReleaseCursor(index + 1))


_Handler = Callable[[MetaMachine, ApplyMeta, Any, Touched], object]

_HANDLERS: dict[type[mc.MetaCommand], _Handler] = {
    mc.Bootstrap: node_changes.on_bootstrap,
    mc.AddNode: node_changes.on_add_node,
    mc.SetNodeState: node_changes.on_set_node_state,
    mc.NodeStarted: node_changes.on_node_started,
    mc.CreateQueue: queue_changes.on_create_queue,
    mc.DeleteQueue: queue_changes.on_delete_queue,
    mc.SetQueuePolicy: queue_changes.on_set_queue_policy,
    mc.SetQueueLeader: queue_changes.on_set_queue_leader,
    mc.AddMember: queue_changes.on_add_member,
    mc.RemoveMember: queue_changes.on_remove_member,
    mc.ReplicaCreated: queue_changes.on_replica_created,
    mc.ReplicaDropped: queue_changes.on_replica_dropped,
    mc.PutUser: access_changes.on_put_user,
    mc.SetPermissions: access_changes.on_set_permissions,
    mc.DeleteUser: access_changes.on_delete_user,
    mc.PutToken: access_changes.on_put_token,
    mc.DeleteToken: access_changes.on_delete_token,
}
assert set(_HANDLERS) == set(mc.COMMANDS)

__all__ = ["MetaMachine", "Touched"]
