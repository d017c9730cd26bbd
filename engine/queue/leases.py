"""The commands that end or extend a lease: settle (ack), return (nack, requeue), discard
(nack, dead-letter with reason ``rejected``), extend; and giving leased messages back.

Rule of this module: a lease ends exactly once, by settle, return, discard or its expiry
(``engine.queue.expiry``); a receipt whose lease is no longer live changes nothing and is
reported stale by its position. A message given back (by return or a lease end) counts a
delivery: it goes to the returns lane of its level, ahead of first deliveries, or is
dead-lettered (reason ``delivery_limit``) once it reached the queue's delivery limit.
These are functions of the machine, called from its handler table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from engine.queue import commands as cmd
from engine.queue.effects import REASON_DELIVERY_LIMIT, REASON_REJECTED, Settled
from engine.queue.refs import sizes_of
from engine.queue.stats import ACKED, RETURNED
from engine.raft.state_machine import ApplyMeta, MachineEffect

if TYPE_CHECKING:
    from engine.queue.machine import QueueMachine


def on_settle(
    m: QueueMachine, meta: ApplyMeta, command: bytes, effects: list[MachineEffect]
) -> object:
    few = cmd.decode_receipts_few(command)
    if few is None:
        return _settle_many(m, command)
    live, stale = m._pending.matching_few(few[0])
    for tag in live:
        ref, _level = m._pending.remove(tag)
        m._bytes_pending -= m._size(ref)
        m._forget(ref)
    m._counters[ACKED] += len(live)
    return Settled(len(live), stale)


def _settle_many(m: QueueMachine, command: bytes) -> object:
    tags, refs, _ = cmd.decode_receipts(command)
    ok = m._pending.matching(tags, refs)
    settled = refs[ok]
    m._pending.remove_many(tags[ok])
    m._bytes_pending -= int(sizes_of(settled, m._fallback).sum())
    m._forget_many(settled)
    count = len(settled)
    m._counters[ACKED] += count
    return Settled(count, tuple(np.flatnonzero(~ok).tolist()))


def on_return(
    m: QueueMachine, meta: ApplyMeta, command: bytes, effects: list[MachineEffect]
) -> object:
    live, stale, _ = m._pending.live_receipts(command)
    give_back(m, live, effects)
    return Settled(len(live), stale)


def on_discard(
    m: QueueMachine, meta: ApplyMeta, command: bytes, effects: list[MachineEffect]
) -> object:
    live, stale, _ = m._pending.live_receipts(command)
    rejected: list[int] = []
    for tag in live:
        ref, _level = m._pending.remove(tag)
        m._bytes_pending -= m._size(ref)
        m._own_delivered_before()[ref] = m._delivered_before.get(ref, 0) + 1
        rejected.append(ref)
    m._dead_letter(rejected, REASON_REJECTED, effects)
    return Settled(len(rejected), stale)


def on_extend(
    m: QueueMachine, meta: ApplyMeta, command: bytes, effects: list[MachineEffect]
) -> object:
    live, stale, lease_ms = m._pending.live_receipts(command)
    lease_ms = min(lease_ms or m.policy.lease_ms, m._limits.lease_ms_max)
    for tag in live:
        m._pending.extend(tag, m._now_ms + lease_ms)
    return Settled(len(live), stale)


def give_back(m: QueueMachine, tags: list[int], effects: list[MachineEffect]) -> None:
    """Return leased messages to the returns lane of their level, or dead-letter those
    that reached the delivery limit."""
    lanes = m._lanes
    limit = m.policy.delivery_limit
    over: list[int] = []
    for tag in tags:
        ref, level = m._pending.remove(tag)
        size = m._size(ref)
        m._bytes_pending -= size
        count = m._delivered_before.get(ref, 0) + 1
        m._own_delivered_before()[ref] = count
        if limit is not None and count >= limit:
            over.append(ref)
            continue
        lanes.returns(level).push(ref)
        m._bytes_ready += size
        m._ready += 1
    m._counters[RETURNED] += len(tags) - len(over)
    m._dead_letter(over, REASON_DELIVERY_LIMIT, effects)


__all__ = ["give_back", "on_discard", "on_extend", "on_return", "on_settle"]
