"""What the metadata machine hands back: small typed replies, and one effect.

Rule of this module: frozen values only. A command that changed nothing because it was
wrong answers the queue machine's ``Rejected(error class, detail)`` (the operating error
the runtime raises to its client); one that found its work already done answers as if it
had done it, so that a retry after an unknown outcome is safe.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from engine.queue import Rejected
from engine.raft.state_machine import MachineEffect


@dataclass(frozen=True, slots=True)
class Ok:
    """Done; ``changed`` is False when the state already was what the command asked."""

    changed: bool


@dataclass(frozen=True, slots=True)
class QueueCreated:
    uid: str
    members: tuple[str, ...]
    leader: str


@dataclass(frozen=True, slots=True)
class QueueExists:
    """A queue of that name exists (creating or live) with the same arguments."""

    uid: str


@dataclass(frozen=True, slots=True)
class QueueDeleting:
    """The queue is being deleted: each member drops its replica, then it is a tombstone."""

    uid: str


@dataclass(frozen=True, slots=True)
class MembersChanged:
    uid: str
    members: tuple[str, ...]
    generation: int


MetaReply = Ok | QueueCreated | QueueExists | QueueDeleting | MembersChanged | Rejected


@dataclass(frozen=True, slots=True)
class MetaChanged(MachineEffect):
    """What one entry changed, by key, for every replica's runtime: it writes those rows
    into its SQLite from the machine's records (a row whose record is gone is deleted)
    and runs its reconcile loop when ``queues`` or ``nodes`` is not empty. After a
    snapshot is installed the runtime rewrites everything instead."""

    leader_only: ClassVar[bool] = False
    index: int
    nodes: tuple[str, ...] = ()
    queues: tuple[str, ...] = ()
    """Queue names."""
    users: tuple[str, ...] = ()
    tokens: tuple[str, ...] = ()
    """Token ids."""


__all__ = [
    "MembersChanged",
    "MetaChanged",
    "MetaReply",
    "Ok",
    "QueueCreated",
    "QueueDeleting",
    "QueueExists",
    "Rejected",
]
