"""A plain model of the cluster metadata, for the stateful test of ``MetaMachine``.

It says what each command should answer, in the form ``expect`` returns, and keeps the
facts a client can rely on: which names exist in which state, who holds what, users and
tokens. Placement is the machine's to choose (``test_placement`` checks it): the model
adopts the members a create or a member removal reports, after checking that they are
possible ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.cluster.replies import (
    MembersChanged,
    Ok,
    QueueCreated,
    QueueDeleting,
    QueueExists,
    Rejected,
)
from engine.errors import Conflict, NotFound, QueueConflict, QueueNotFound, ValidationFailed
from engine.limits import Limits
from engine.queue import QueuePolicy

NODE_MOVES = {
    "active": {"draining", "lost"},
    "draining": {"active", "lost"},
    "lost": {"active", "forgotten"},
    "forgotten": set(),
}
LIFECYCLE = {("creating", "live"), ("creating", "deleting"), ("live", "deleting")}
LIFECYCLE |= {("deleting", "tombstone")}


@dataclass
class Q:
    name: str
    uid: str
    replicas: int
    policy: QueuePolicy
    state: str
    members: set[str]
    leader: str
    generation: int = 1
    created: set[str] = field(default_factory=set)
    dropped: set[str] = field(default_factory=set)


def outcome(reply: object) -> tuple[Any, ...]:
    """A reply as the model states it."""
    if isinstance(reply, Rejected):
        return ("rejected", reply.error)
    if isinstance(reply, Ok):
        return ("ok", reply.changed)
    if isinstance(reply, QueueCreated):
        return ("created",)
    if isinstance(reply, QueueExists):
        return ("exists", reply.uid)
    if isinstance(reply, QueueDeleting):
        return ("deleting", reply.uid)
    if isinstance(reply, MembersChanged):
        return ("members",)
    raise AssertionError(reply)


def rejected(error: type[Exception]) -> tuple[Any, ...]:
    return ("rejected", error)


class Model:
    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.nodes: dict[str, list[Any]] = {}
        """name -> [address, state, state index]."""
        self.queues: dict[str, Q] = {}
        self.tombstones: list[str] = []
        self.users: dict[str, tuple[str, str, tuple[str, str, str]]] = {}
        """name -> (hash, role, (configure, write, read))."""
        self.tokens: dict[str, tuple[str, str, str, str]] = {}
        """id -> (user, digest, prefix, name)."""

    # --- queries ---------------------------------------------------------------------

    def by_uid(self, uid: str) -> Q | None:
        return next((q for q in self.queues.values() if q.uid == uid), None)

    def active(self) -> set[str]:
        return {n for n, (_a, state, _i) in self.nodes.items() if state == "active"}

    def live_count(self) -> int:
        return sum(1 for q in self.queues.values() if q.state != "tombstone")

    # --- nodes -----------------------------------------------------------------------

    def add_node(self, name: str, address: str, index: int) -> tuple[Any, ...]:
        known = self.nodes.get(name)
        if known is not None and known[1] != "forgotten":
            return rejected(Conflict) if known[0] != address else ("ok", False)
        if known is None and len(self.nodes) >= self.limits.cluster_nodes_max:
            forgotten = sorted((i, n) for n, (_a, s, i) in self.nodes.items() if s == "forgotten")
            if not forgotten:
                return rejected(ValidationFailed)
            del self.nodes[forgotten[0][1]]
        self.nodes[name] = [address, "active", index]
        return ("ok", True)

    def set_node_state(self, name: str, state: str, index: int) -> tuple[Any, ...]:
        if state not in NODE_MOVES:
            return rejected(ValidationFailed)
        if name not in self.nodes:
            return rejected(NotFound)
        current = self.nodes[name][1]
        if current == state:
            return ("ok", False)
        if state not in NODE_MOVES[current]:
            return rejected(Conflict)
        if state == "forgotten":
            if any(q.state in ("creating", "live") and name in q.members for q in self._qs()):
                return rejected(Conflict)
            for q in sorted(self._qs(), key=lambda q: q.name):
                if q.state == "deleting" and name in q.members:
                    q.dropped.add(name)
                    self._maybe_tombstone(q)
        self.nodes[name][1:] = [state, index]
        return ("ok", True)

    # --- queues ----------------------------------------------------------------------

    def create(self, name: str, replicas: int, policy: QueuePolicy) -> tuple[Any, ...]:
        if not _policy_ok(policy, self.limits):
            return rejected(ValidationFailed)
        q = self.queues.get(name)
        if q is not None and q.state in ("creating", "live"):
            if (q.replicas, q.policy) != (replicas, policy):
                return rejected(QueueConflict)
            return ("exists", q.uid)
        if q is not None and q.state == "deleting":
            return rejected(QueueConflict)
        if self.live_count() >= self.limits.cluster_queues_max:
            return rejected(ValidationFailed)
        if not 1 <= replicas <= len(self.active()):
            return rejected(ValidationFailed)
        return ("created",)

    def adopt_created(self, name: str, replicas: int, policy: QueuePolicy, reply: Any) -> None:
        """The create succeeded with the machine's placement: check it is a possible one."""
        assert len(reply.members) == replicas == len(set(reply.members))
        assert set(reply.members) <= self.active() and reply.leader in reply.members
        assert reply.uid not in {q.uid for q in self.queues.values()}
        if name in self.tombstones:
            self.tombstones.remove(name)
        self.queues[name] = Q(
            name, reply.uid, replicas, policy, "creating", set(reply.members), reply.leader
        )

    def delete(self, name: str, uid: str) -> tuple[Any, ...]:
        q = self.queues.get(name)
        if q is None or q.state == "tombstone" or uid not in ("", q.uid):
            return rejected(QueueNotFound)
        q.state = "deleting"
        return ("deleting", q.uid)

    def set_policy(self, uid: str, policy: QueuePolicy) -> tuple[Any, ...]:
        q, error = self._existing(uid)
        if q is None:
            return error
        if not _policy_ok(policy, self.limits) or policy.priorities != q.policy.priorities:
            return rejected(ValidationFailed)
        changed = policy != q.policy
        q.policy = policy
        return ("ok", changed)

    def set_leader(self, uid: str, node: str) -> tuple[Any, ...]:
        q, error = self._existing(uid)
        if q is None:
            return error
        if node not in q.members:
            return rejected(QueueNotFound)
        changed = node != q.leader
        q.leader = node
        return ("ok", changed)

    def add_member(self, uid: str, node: str, generation: int) -> tuple[Any, ...]:
        q, error = self._existing(uid)
        if q is None:
            return error
        if generation != q.generation:
            return rejected(Conflict)
        if node not in self.active():
            return rejected(ValidationFailed)
        if node in q.members:
            return rejected(QueueConflict)
        q.members.add(node)
        q.generation += 1
        return ("members",)

    def remove_member(self, uid: str, node: str, generation: int) -> tuple[Any, ...]:
        q, error = self._existing(uid)
        if q is None:
            return error
        if generation != q.generation:
            return rejected(Conflict)
        if node not in q.members:
            return rejected(QueueNotFound)
        if len(q.members) == 1:
            return rejected(QueueConflict)
        q.members.discard(node)
        q.created.discard(node)
        q.generation += 1
        self._maybe_live(q)
        return ("members",)

    def replica_created(self, node: str, uid: str) -> tuple[Any, ...]:
        q = self.by_uid(uid)
        if q is None:
            return rejected(QueueNotFound)
        if q.state in ("deleting", "tombstone"):
            return ("ok", False)
        if node not in q.members:
            return rejected(Conflict)
        if node in q.created:
            return ("ok", False)
        q.created.add(node)
        self._maybe_live(q)
        return ("ok", True)

    def replica_dropped(self, node: str, uid: str) -> tuple[Any, ...]:
        q = self.by_uid(uid)
        if q is None:
            return rejected(QueueNotFound)
        if q.state == "tombstone" or node not in q.members or node in q.dropped:
            return ("ok", False)
        if q.state != "deleting":
            return rejected(QueueConflict)
        q.dropped.add(node)
        self._maybe_tombstone(q)
        return ("ok", True)

    # --- users and tokens ------------------------------------------------------------

    def put_user(self, name: str, password_hash: str, role: str) -> tuple[Any, ...]:
        if role not in ("admin", "user"):
            return rejected(ValidationFailed)
        known = self.users.get(name)
        if known is None:
            if len(self.users) >= self.limits.cluster_users_max:
                return rejected(ValidationFailed)
            self.users[name] = (password_hash, role, ("", "", ""))
            return ("ok", True)
        if known[:2] == (password_hash, role):
            return ("ok", False)
        self.users[name] = (password_hash, role, known[2])
        return ("ok", True)

    def set_permissions(self, user: str, patterns: tuple[str, str, str]) -> tuple[Any, ...]:
        known = self.users.get(user)
        if known is None:
            return rejected(NotFound)
        self.users[user] = (known[0], known[1], patterns)
        return ("ok", known[2] != patterns)

    def delete_user(self, name: str) -> tuple[Any, ...]:
        if name not in self.users:
            return rejected(NotFound)
        del self.users[name]
        self.tokens = {k: t for k, t in self.tokens.items() if t[0] != name}
        return ("ok", True)

    def put_token(self, token_id: str, token: tuple[str, str, str, str]) -> tuple[Any, ...]:
        user, digest = token[0], token[1]
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            return rejected(ValidationFailed)
        if user not in self.users:
            return rejected(NotFound)
        known = self.tokens.get(token_id)
        if known is not None:
            return ("ok", False) if known == token else rejected(Conflict)
        if any(t[1] == digest for t in self.tokens.values()):
            return rejected(Conflict)
        if len(self.tokens) >= self.limits.cluster_tokens_max:
            return rejected(ValidationFailed)
        self.tokens[token_id] = token
        return ("ok", True)

    def delete_token(self, token_id: str) -> tuple[Any, ...]:
        if self.tokens.pop(token_id, None) is None:
            return rejected(NotFound)
        return ("ok", True)

    # --- helpers ---------------------------------------------------------------------

    def _qs(self) -> list[Q]:
        return list(self.queues.values())

    def _existing(self, uid: str) -> tuple[Q | None, tuple[Any, ...]]:
        q = self.by_uid(uid)
        if q is None:
            return None, rejected(QueueNotFound)
        if q.state not in ("creating", "live"):
            return None, rejected(QueueConflict)
        return q, ()

    @staticmethod
    def _maybe_live(q: Q) -> None:
        if q.state == "creating" and 2 * len(q.created) > len(q.members):
            q.state = "live"

    def _maybe_tombstone(self, q: Q) -> None:
        if q.members <= q.dropped:
            q.state = "tombstone"
            self.tombstones.append(q.name)
        while len(self.tombstones) > self.limits.cluster_tombstones_max:
            del self.queues[self.tombstones.pop(0)]


def _policy_ok(policy: QueuePolicy, limits: Limits) -> bool:
    return not policy.check(
        limits.lease_ms_max, limits.priorities_max, limits.message_bytes_max_ceiling
    )


__all__ = ["LIFECYCLE", "Model", "Q", "outcome", "rejected"]
