"""What the cluster metadata holds: frozen records of nodes, queues, users and tokens.

Rule of this module: values only. A record is replaced, never changed in place, so the
runtime may keep one it was handed while the machine moves on. Node names in a record's
tuples are sorted (one spelling of one set: two replicas that applied the same log hold
equal records). Times are the leader's ``now_ms`` of the entry that made the change;
indexes are metadata log indexes.

A queue's lifecycle is ``creating -> live -> deleting -> tombstone``, each change
stamped with its index. Its ``members`` are where its replicas should be (the
placement), changed one at a time against a ``generation``; ``bootstrap`` is the first
placement, the configuration the group was formed with, which a founder that creates its
replica late must start from (``founders``: the bootstrap members never removed since).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Literal, get_args

from engine.queue import QueuePolicy

NodeState = Literal["active", "draining", "lost", "forgotten"]
NODE_STATES: tuple[NodeState, ...] = get_args(NodeState)
QueueState = Literal["creating", "live", "deleting", "tombstone"]
QUEUE_STATES: tuple[QueueState, ...] = get_args(QueueState)
Role = Literal["admin", "user"]
ROLES: tuple[Role, ...] = get_args(Role)

NODE_MOVES: dict[NodeState, tuple[NodeState, ...]] = {
    "active": ("draining", "lost"),
    "draining": ("active", "lost"),
    "lost": ("active", "forgotten"),
    "forgotten": (),
}
"""The states a node may move to from each state. A lost node that comes back is active
again; a forgotten node is gone for good (its name may join again as a new node)."""


@dataclass(frozen=True, slots=True)
class NodeRecord:
    name: str
    address: str
    """Where its peers reach it (``host:port`` of its cluster listener)."""
    state: NodeState
    joined_index: int
    state_index: int
    """The index of the entry that set ``state``."""
    incarnation: str = ""
    """The id of the data directory the node runs from, as it reported once started
    (``NodeStarted``); empty until then. A peer refuses the node from another data
    directory under this name (``engine.cluster.rejoin.lost_data_refusal``)."""


@dataclass(frozen=True, slots=True)
class QueueRecord:
    name: str
    uid: str
    replicas: int
    policy: QueuePolicy
    """The queue's arguments (with ``replicas``: what ``PUT /queues/{name}`` took), as its
    policy changes last left them."""
    state: QueueState
    members: tuple[str, ...]
    leader: str
    """The member that should lead (placement spreads leaders); a hint, never a fact."""
    generation: int
    """1 at creation, +1 at every change of ``members``."""
    bootstrap: tuple[str, ...]
    founders: tuple[str, ...]
    created: tuple[str, ...]
    """Members that reported their replica created (since they last became members)."""
    dropped: tuple[str, ...]
    """Members that reported their replica dropped (while deleting)."""
    created_at_ms: int
    created_index: int
    live_index: int = 0
    deleting_index: int = 0
    tombstone_index: int = 0
    first_policy: QueuePolicy | None = None
    """The policy the queue was created with, once a change replaced ``policy`` (``None``
    until then): what a replica created later starts from, since it replays the queue's
    log from its start, the policy changes included (replicas that started from
    different policies could apply the same entries differently)."""

    @property
    def created_policy(self) -> QueuePolicy:
        return self.first_policy or self.policy


@dataclass(frozen=True, slots=True)
class UserRecord:
    name: str
    password_hash: str
    """The argon2 hash, never the password."""
    role: Role
    configure: str
    write: str
    read: str
    """Permissions: regular expressions over queue names, matched in full."""
    created_at_ms: int
    updated_index: int


@dataclass(frozen=True, slots=True)
class TokenRecord:
    id: str
    user: str
    digest: str
    """SHA-256 of the token, hex; the token itself is never stored."""
    prefix: str
    name: str
    created_at_ms: int


Record = NodeRecord | QueueRecord | UserRecord | TokenRecord


def split_address(text: str) -> tuple[str, int] | None:
    """``host:port`` (``[v6]:port``) as the metadata records it; ``None`` if malformed."""
    host, colon, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not colon or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        return None
    return host, int(port)


def record_to_wire(record: Record) -> list[Any]:
    """The record's fields in order, the policy as its dict (for a snapshot)."""
    out: list[Any] = []
    for f in fields(record):
        value = getattr(record, f.name)
        out.append(value.to_wire() if isinstance(value, QueuePolicy) else value)
    return out


def queue_from_wire(values: list[Any]) -> QueueRecord:
    names = [f.name for f in fields(QueueRecord)]
    # A snapshot from before a field with a default was added lacks it.
    known = dict(zip(names[: len(values)], values, strict=True))
    known["policy"] = QueuePolicy(**known["policy"])
    if known.get("first_policy") is not None:
        known["first_policy"] = QueuePolicy(**known["first_policy"])
    for name in ("members", "bootstrap", "founders", "created", "dropped"):
        known[name] = tuple(known[name])
    return QueueRecord(**known)


__all__ = [
    "NODE_MOVES",
    "NODE_STATES",
    "QUEUE_STATES",
    "ROLES",
    "NodeRecord",
    "NodeState",
    "QueueRecord",
    "QueueState",
    "Record",
    "Role",
    "TokenRecord",
    "UserRecord",
    "queue_from_wire",
    "record_to_wire",
    "split_address",
]
