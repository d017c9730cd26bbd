"""What a Raft server is made with: its id, its source of chance, its limits and switches."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Protocol

from engine.ids import ServerId
from engine.limits import DEFAULT_LIMITS, Limits


class RandomSource(Protocol):
    """What the core needs of a ``random.Random`` (which satisfies it)."""

    def randint(self, a: int, b: int) -> int: ...


class Fault(IntEnum):
    """Deliberate bugs, for tests that prove the simulator's checkers catch them."""

    NONE = 0
    COMMIT_ANY_TERM = 1
    """Commit entries of earlier terms by counting replicas (breaks Raft section 5.4.2)."""
    COMMIT_QUORUM_OFF_BY_ONE = 2
    """Count one replica fewer than a majority as a quorum (at least one)."""
    REPAIR_OFF = 3
    """Start as a normal member although storage lost durable data (no repair mode)."""
    SEND_BEFORE_DURABLE = 4
    """The replica driver sends the messages that must wait for the disk (votes, append
    acknowledgements) at once, before the writes they promise are durable."""


@dataclass(frozen=True, slots=True)
class RaftOptions:
    server_id: ServerId
    rng: RandomSource
    limits: Limits = DEFAULT_LIMITS
    pre_vote: bool = True
    check_quorum: bool = True
    fault: Fault = Fault.NONE


__all__ = ["Fault", "RaftOptions", "RandomSource"]
