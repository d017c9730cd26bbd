"""The policy command: a queue's policy changed after it was created.

Rule of this module: a change is all or nothing, checked against the limits like a new
policy (``check_policy``); ``priorities`` is fixed at creation, since the lanes are laid
out by level. What the queue holds follows the new policy at once: a queue TTL set on a
queue without one counts for the messages already there from the change (never early;
``engine.queue.enqueue_times``), removing it forgets the enqueue times; removing the
dead-letter target drops the messages waiting for it; overflow ``drop-head`` trims the
queue to its limits.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from engine.errors import QueueConflict, ValidationFailed
from engine.limits import Limits
from engine.queue import commands as cmd
from engine.queue.commands import QueuePolicy
from engine.queue.effects import PolicyChanged, Rejected
from engine.queue.overflow import drop_head
from engine.queue.stats import DROPPED
from engine.raft.state_machine import ApplyMeta, MachineEffect

if TYPE_CHECKING:
    from engine.queue.machine import QueueMachine


def check_policy(policy: QueuePolicy, limits: Limits) -> str:
    """Why ``policy`` is not allowed under ``limits`` ("" if it is)."""
    return policy.check(
        limits.lease_ms_max,
        limits.priorities_max,
        limits.message_bytes_max_ceiling,
    )


def on_policy(
    m: QueueMachine, meta: ApplyMeta, command: bytes, effects: list[MachineEffect]
) -> object:
    changes = cmd.decode_policy(command)
    if "priorities" in changes and changes["priorities"] != m.policy.priorities:
        return Rejected(QueueConflict, "priorities is fixed when the queue is created")
    try:
        policy = dataclasses.replace(m.policy, **changes)  # type: ignore[arg-type]
    except TypeError as e:
        return Rejected(ValidationFailed, str(e))
    why = check_policy(policy, m._limits)
    if why:
        return Rejected(ValidationFailed, why)
    if policy.message_ttl_ms is None:
        m._times.clear()
    elif m.policy.message_ttl_ms is None:
        m._times.restart(m._now_ms)
    m.policy = policy
    if policy.dead_letter_queue is None and m._dead_letters:
        dropped = m._dead_letters.clear()
        m._forget_many(dropped)
        m._counters[DROPPED] += len(dropped)
    if policy.overflow == cmd.OVERFLOW_DROP_HEAD:
        drop_head(m, effects)
    return PolicyChanged(policy)


__all__ = ["check_policy", "on_policy"]
