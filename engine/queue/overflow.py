"""Overflow: what a queue at its ``max_length`` or ``max_bytes`` does.

Rule of this module: the limits count the ready and delayed messages (not leased nor
dead-lettering ones). With overflow ``reject-publish`` a batch that would exceed them is
rejected whole (``engine.queue.enqueue``); with ``drop-head`` it is accepted and messages
are then dead-lettered (reason ``maxlen``) from the head of the lowest level, its returns
lane first, then delayed messages, until the queue is within its limits again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.queue.effects import REASON_MAXLEN
from engine.raft.state_machine import MachineEffect

if TYPE_CHECKING:
    from engine.queue.machine import QueueMachine


def over_limits(m: QueueMachine, extra_count: int = 0, extra_bytes: int = 0) -> bool:
    """Whether the messages that count against max_length / max_bytes (ready and
    delayed), with ``extra_count`` more of ``extra_bytes``, exceed them."""
    p = m.policy
    if p.max_length is None and p.max_bytes is None:
        return False
    count = m._ready + len(m._delayed)
    size = m._bytes_ready + m._bytes_delayed
    return (p.max_length is not None and count + extra_count > p.max_length) or (
        p.max_bytes is not None and size + extra_bytes > p.max_bytes
    )


def drop_head(m: QueueMachine, effects: list[MachineEffect]) -> None:
    """Overflow ``drop-head``: dead-letter (reason ``maxlen``) from the head of the lowest
    level (its returns lane first), then delayed messages, until within the limits."""
    dropped: list[int] = []
    order = m._lanes.drop_order()
    while over_limits(m):
        lane = next((lane for lane in order if lane), None)
        if lane is not None:
            ref = lane.pop()
            m._bytes_ready -= m._size(ref)
            m._ready -= 1
        else:
            ref = m._delayed.pop_first()
            m._bytes_delayed -= m._size(ref)
        dropped.append(ref)
    m._dead_letter(dropped, REASON_MAXLEN, effects)


__all__ = ["drop_head", "over_limits"]
