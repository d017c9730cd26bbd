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


_MASK64 = (1 << 64) - 1


class SplitMix64:
    """A ``RandomSource`` of one 64-bit state (SplitMix64, Steele et al. 2014): what a
    node hosting thousands of replicas gives each one's core, for ``random.Random``
    holds 2.5 KiB of Mersenne Twister state. Election timeouts need spread, not
    cryptographic quality; a range of a few hundred ms drawn from 64 bits is uniform to
    within 2^-50."""

    __slots__ = ("_state",)

    def __init__(self, seed: int) -> None:
        self._state = seed & _MASK64

    def next64(self) -> int:
        self._state = (self._state + 0x9E3779B97F4A7C15) & _MASK64
        z = self._state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        return z ^ (z >> 31)

    def randint(self, a: int, b: int) -> int:
        assert a <= b
        return a + self.next64() % (b - a + 1)


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


__all__ = ["Fault", "RaftOptions", "RandomSource", "SplitMix64"]
