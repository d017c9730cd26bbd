"""What the queue machine hands back: replies (to the proposer) and effects (for the runtime).

Rule of this module: frozen values only. Effects are performed by the leader alone
(``leader_only``); a replay or a follower drops them, which is safe because each one is
repeated by the machine until it is confirmed (dead-lettering) or is a mere wake-up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from engine.errors import QuorraError
from engine.quick_init import quick_init
from engine.raft.state_machine import MachineEffect

REASON_REJECTED = "rejected"
REASON_EXPIRED = "expired"
REASON_DELIVERY_LIMIT = "delivery_limit"
REASON_MAXLEN = "maxlen"
DEAD_LETTER_REASONS = (REASON_REJECTED, REASON_EXPIRED, REASON_DELIVERY_LIMIT, REASON_MAXLEN)


@dataclass(frozen=True, slots=True)
class DeadLetter(MachineEffect):
    """Move these messages to queue ``target``, at least once.

    For each ref the runtime reads the message from this queue's log (``machine.ref_parts``
    then ``read_message``), adds the headers ``x-death-reason`` = ``reason``,
    ``x-death-queue`` and ``x-delivery-count`` (from ``delivery_counts``), publishes it to
    ``target`` with dedup id ``dlx:<source queue uid>:<message id>`` (so a repeated effect
    is not enqueued twice within the target's dedup window), and once the target has
    committed it proposes ``encode_dead_letter_confirm(refs)`` here. Until then the
    messages stay live in this queue's log and the effect is emitted again every
    ``Limits.dead_letter_retry_ms`` by the expire command, which also covers a change of
    leader. If ``target`` does not exist, the runtime confirms them (they are dropped).
    """

    leader_only: ClassVar[bool] = True
    target: str
    reason: str
    refs: tuple[int, ...]
    delivery_counts: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class MessagesAvailable(MachineEffect):
    """Ready messages appeared on an empty queue: wake receivers waiting in a long poll."""

    leader_only: ClassVar[bool] = True
    messages_ready: int


# --- replies ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Rejected:
    """The command changed nothing; ``error`` is the operating error to raise to the client."""

    error: type[QuorraError]
    detail: str

    def to_error(self) -> QuorraError:
        return self.error(self.detail)


@quick_init
@dataclass(frozen=True, slots=True)
class Enqueued:
    """``ids[k]`` is the public message id of message ``k`` of the batch; for a duplicate
    (``duplicate[k]``) it is the id of the first message published with that dedup id."""

    ids: tuple[int, ...]
    duplicate: tuple[bool, ...]


@dataclass(frozen=True, slots=True)
class Delivery:
    tag: int
    ref: int
    priority: int
    delivery_count: int
    """1 on the first delivery."""


@dataclass(frozen=True, slots=True)
class CheckedOut:
    """The messages leased by a checkout, as parallel tuples (no object per message);
    ``deliveries`` gives them as ``Delivery`` values."""

    tags: tuple[int, ...]
    refs: tuple[int, ...]
    priorities: tuple[int, ...]
    delivery_counts: tuple[int, ...]
    lease_expires_ms: int

    def __post_init__(self) -> None:
        n = len(self.tags)
        assert len(self.refs) == len(self.priorities) == len(self.delivery_counts) == n

    @property
    def deliveries(self) -> tuple[Delivery, ...]:
        return tuple(
            Delivery(*fields)
            for fields in zip(
                self.tags, self.refs, self.priorities, self.delivery_counts, strict=True
            )
        )


@dataclass(frozen=True, slots=True)
class Settled:
    """Outcome of settle/return/discard/extend: how many receipts took effect, and the
    positions (in the command's receipt list) of the stale ones."""

    count: int
    stale: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class SettledCheckedOut:
    """Outcome of a settle-checkout (a receive carrying acks): the settle's, then the
    checkout's, as each alone would answer."""

    settled: Settled
    checked_out: CheckedOut


@dataclass(frozen=True, slots=True)
class Purged:
    count: int


@dataclass(frozen=True, slots=True)
class Expired:
    """Result of the timer command (counts of this sweep)."""

    leases_expired: int
    messages_expired: int
    delayed_released: int


@dataclass(frozen=True, slots=True)
class PolicyChanged:
    policy: object
    """The whole new ``QueuePolicy``."""


@dataclass(frozen=True, slots=True)
class DeadLetterConfirmed:
    count: int


__all__ = [
    "DEAD_LETTER_REASONS",
    "REASON_DELIVERY_LIMIT",
    "REASON_EXPIRED",
    "REASON_MAXLEN",
    "REASON_REJECTED",
    "CheckedOut",
    "DeadLetter",
    "DeadLetterConfirmed",
    "Delivery",
    "Enqueued",
    "Expired",
    "MessagesAvailable",
    "PolicyChanged",
    "Purged",
    "Rejected",
    "Settled",
    "SettledCheckedOut",
]
