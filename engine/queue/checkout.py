"""The checkout command: ready messages delivered under a lease.

Rule of this module: levels are served from the highest down and, within a level, the
returns lane before the main lane (``engine.queue.lanes``); time advances first (due
delayed messages released, ended leases given back, expired heads swept), and an
expired head met while taking is dead-lettered, never delivered. Every message taken
gets the next delivery tag of ``engine.queue.pending`` and one more delivery.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from engine.queue import commands as cmd
from engine.queue.effects import REASON_EXPIRED, CheckedOut, Settled, SettledCheckedOut
from engine.queue.expiry import advance_time, is_expired
from engine.queue.leases import on_settle
from engine.queue.pages import RefFifo
from engine.queue.refs import sizes_of
from engine.queue.stats import DELIVERED
from engine.raft.state_machine import ApplyMeta, MachineEffect

if TYPE_CHECKING:
    from engine.queue.machine import QueueMachine

U64 = npt.NDArray[np.uint64]

_CHECKOUT_FEW_MAX = 16
"""A checkout of at most this many messages pops them one by one (no numpy call)."""


def on_checkout(
    m: QueueMachine, meta: ApplyMeta, command: bytes, effects: list[MachineEffect]
) -> object:
    c = cmd.decode_checkout(command)
    advance_time(m, effects)
    lease_ms = min(c.lease_ms or m.policy.lease_ms, m._limits.lease_ms_max)
    expires_ms = m._now_ms + lease_ms
    wanted = min(c.max_messages, m._limits.receive_messages_max)
    tags: list[int] = []
    refs_out: list[int] = []
    levels_out: list[int] = []
    counts: list[int] = []
    expired: list[int] = []
    for level, returns, main in m._lanes.by_level():
        if len(tags) >= wanted:
            break
        first_lane = _take(m, returns, wanted - len(tags), expired)
        second_lane = _take(m, main, wanted - len(tags) - len(first_lane), expired)
        refs: list[int] | U64
        if isinstance(first_lane, list) and isinstance(second_lane, list):
            refs = taken = first_lane + second_lane
            size = sum(map(m._size, taken))
        else:
            refs = np.concatenate(
                [np.asarray(first_lane, np.uint64), np.asarray(second_lane, np.uint64)]
            )
            size = int(sizes_of(refs, m._fallback).sum())
            taken = refs.tolist()
        if not taken:
            continue
        m._bytes_ready -= size
        m._ready -= len(taken)
        m._bytes_pending += size
        first = m._pending.add(refs, c.consumer, level, expires_ms)
        tags += range(first, first + len(taken))
        refs_out += taken
        levels_out += [level] * len(taken)
        before = m._delivered_before
        counts += [before.get(ref, 0) + 1 for ref in taken] if before else [1] * len(taken)
    m._dead_letter(expired, REASON_EXPIRED, effects)
    m._counters[DELIVERED] += len(tags)
    return CheckedOut(tuple(tags), tuple(refs_out), tuple(levels_out), tuple(counts), expires_ms)


def on_settle_checkout(
    m: QueueMachine, meta: ApplyMeta, command: bytes, effects: list[MachineEffect]
) -> object:
    """A receive carrying the acks of the previous batch: the settle, then the checkout,
    each by its own handler, so the pair means exactly what the two entries would mean
    applied back to back (a settled message is gone before the checkout looks). Both
    parts are checked before either is applied: a malformed entry changes nothing."""
    settle, checkout = cmd.split_settle_checkout(command)
    settled = on_settle(m, meta, settle, effects)
    checked_out = on_checkout(m, meta, checkout, effects)
    assert isinstance(settled, Settled) and isinstance(checked_out, CheckedOut)
    return SettledCheckedOut(settled, checked_out)


def _take(m: QueueMachine, lane: RefFifo, n: int, expired: list[int]) -> list[int] | U64:
    """Pop up to ``n`` deliverable refs from a lane; expired heads go to ``expired``.
    An array when many are wanted and none can have expired, else a list."""
    if n <= 0 or not lane:
        return []
    may_expire = m.policy.message_ttl_ms is not None or bool(m._expires_at)
    if not may_expire and n > _CHECKOUT_FEW_MAX:
        return lane.pop_many(n)
    out: list[int] = []
    while lane and len(out) < n:
        ref = lane.pop()
        if may_expire and is_expired(m, ref):
            m._bytes_ready -= m._size(ref)
            m._ready -= 1
            expired.append(ref)
        else:
            out.append(ref)
    return out


__all__ = ["on_checkout", "on_settle_checkout"]
