"""The contract between Raft and the state machines it replicates (as in Ra's ``ra_machine``).

A machine is deterministic: the same commands at the same indexes give the same state,
replies and effects on every replica. It reads no clock and no randomness; time arrives
in ``ApplyMeta.now_ms``, stamped by the leader into each entry when it was proposed.

Python state is mutable, so the state is the machine object itself: ``apply`` changes it
and returns ``(reply, effects)``, which is Ra's ``apply(meta, command, state) ->
{state, reply, effects}`` with the state threaded implicitly. ``snapshot``/``restore``
turn the light state (references, never payloads) into bytes and back.

A *hybrid* machine keeps payloads in the log: ``live_indexes`` names the entries before
the last applied index that still hold data the machine needs. Every other entry is dead
and compaction may reclaim it once a checkpoint covers it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

from pyroaring import BitMap64

from engine.quick_init import quick_init


@quick_init
@dataclass(frozen=True, slots=True)
class ApplyMeta:
    index: int
    term: int
    now_ms: int
    """The leader's clock when the entry was proposed; never decreases along the log."""


class MachineEffect:
    """Base of the effects a machine returns. Subclasses are frozen dataclasses.

    ``leader_only`` effects are performed by the leader alone and dropped by followers
    and during replay (a reply to a client, a notification); the others are performed by
    every replica (taking a checkpoint of its own state).
    """

    leader_only: ClassVar[bool] = True


@dataclass(frozen=True, slots=True)
class CheckpointRequest(MachineEffect):
    """Take a checkpoint of the machine state as of ``index`` (the entry just applied).

    The runtime serialises the state before applying the next entry, writes it without
    truncating the log, and then runs compaction (see ``engine.storage``).
    """

    leader_only: ClassVar[bool] = False
    index: int


@dataclass(frozen=True, slots=True)
class ReleaseCursor(MachineEffect):
    """Entries below ``index`` are needed only if they are in ``live_indexes()``."""

    leader_only: ClassVar[bool] = False
    index: int


class Machine(Protocol):
    """What Raft needs of a replicated state machine."""

    version: ClassVar[int]
    """Bumped when the snapshot format or the semantics of a command change."""

    def apply(self, meta: ApplyMeta, command: bytes) -> tuple[object, list[MachineEffect]]:
        """Apply one committed command entry. Raft's own entries (no-op, membership)
        never reach the machine."""
        ...

    def live_indexes(self) -> BitMap64:
        """Log indexes at or below the last applied one whose data the machine still needs."""
        ...

    def snapshot(self) -> bytes:
        """The light state as bytes: what a checkpoint stores and ``restore`` reads."""
        ...

    def restore(self, data: bytes) -> None:
        """Replace the whole state with one produced by ``snapshot``."""
        ...


__all__ = ["ApplyMeta", "CheckpointRequest", "Machine", "MachineEffect", "ReleaseCursor"]
