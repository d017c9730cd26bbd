"""Time passing in a queue: delayed messages released, leases ended, expired heads swept.

Rule of this module: time comes only from the leader's ``now_ms`` of the command applied
(``QueueMachine._now_ms``, which never goes back). Expiry is at the head (as in RabbitMQ
quorum queues): a message whose TTL passed is never delivered; it is dead-lettered
(reason ``expired``) when it reaches the head of its lane during a checkout (at the
checkout's leader time) or an expire sweep, which the leader proposes at the head's
exact expiry time (``QueueMachine.next_deadline_ms``). Until then it counts as ready.
Per-message ``ttl_ms`` is exact; queue TTL bounds each message's enqueue time by a
sparse series of (Raft index, leader ms) samples (``engine.queue.enqueue_times``), so it
is never early and at most ``Limits.enqueue_time_resolution_ms - 1`` late. A lease that
ends counts as a delivery attempt (``engine.queue.leases.give_back``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.queue.effects import REASON_EXPIRED, Expired
from engine.queue.leases import give_back
from engine.raft.state_machine import ApplyMeta, MachineEffect

if TYPE_CHECKING:
    from engine.queue.machine import QueueMachine


def on_expire(
    m: QueueMachine, meta: ApplyMeta, command: bytes, effects: list[MachineEffect]
) -> object:
    leases, messages, released = advance_time(m, effects)
    effects += m._dead_letters.retry(m.policy.dead_letter_queue, m._now_ms)
    return Expired(leases, messages, released)


def advance_time(m: QueueMachine, effects: list[MachineEffect]) -> tuple[int, int, int]:
    """Release due delayed messages, end expired leases, sweep expired heads."""
    released = 0
    for ref, level in m._delayed.pop_due(m._now_ms):
        size = m._size(ref)
        m._bytes_delayed -= size
        m._bytes_ready += size
        m._ready += 1
        m._lanes.main(level).push(ref)
        released += 1
    tags = m._pending.take_expired(m._now_ms)
    give_back(m, tags, effects)
    expired: list[int] = []
    may_expire = m.policy.message_ttl_ms is not None or bool(m._expires_at)
    for lane in m._lanes.fifos if may_expire else ():
        while lane and is_expired(m, lane.peek()):
            ref = lane.pop()
            m._bytes_ready -= m._size(ref)
            m._ready -= 1
            expired.append(ref)
    m._dead_letter(expired, REASON_EXPIRED, effects)
    return len(tags), len(expired), released


def expiry_of(m: QueueMachine, ref: int) -> int | None:
    expiry = m._expires_at.get(ref)
    ttl_ms = m.policy.message_ttl_ms
    if ttl_ms is not None:
        by_queue = m._times.bound_ms(m._fallback.unpack(ref).index) + ttl_ms
        expiry = by_queue if expiry is None else min(expiry, by_queue)
    return expiry


def is_expired(m: QueueMachine, ref: int) -> bool:
    expiry = expiry_of(m, ref)
    return expiry is not None and expiry <= m._now_ms


__all__ = ["advance_time", "expiry_of", "is_expired", "on_expire"]
