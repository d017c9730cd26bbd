"""The enqueue command: a publish batch, all or nothing.

Rule of this module: a batch is rejected whole (too many messages, a message too large,
or the queue full under overflow ``reject-publish``), else every message of it is either
a duplicate (its dedup id was seen within the window, ``engine.queue.dedup``: it is
acknowledged with the first message's id and not enqueued) or placed: in the delayed
heap if it has a ``delay_ms``, else at the tail of its level's main lane. A frame (a
run of messages under one dedup id, ``enqueue_codec.FLAG_FRAME``) is a duplicate whole
when its id was seen within the window (every message of it, message ``j`` acknowledged
with the first frame's message ``j``'s id), else placed as any message. Batches of up
to ``ENQUEUE_FEW_MAX`` messages are read as tuples and placed one by one; larger ones as
numpy arrays, in fewer operations when every message is its body alone (the usual
publish: ``enqueue_body_sizes``). All reach the same state: the stateful test and
tests/engine/queue/test_fast_paths.py compare them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from engine.errors import MessageTooLarge, QueueFull
from engine.queue import enqueue_codec as codec
from engine.queue.commands import OVERFLOW_REJECT_PUBLISH
from engine.queue.effects import Enqueued, Rejected
from engine.queue.enqueue_codec import FLAG_FRAME, RECORD_BYTES
from engine.queue.overflow import drop_head, over_limits
from engine.queue.refs import (
    INDEX_LIMIT_SHORT,
    SIZE_BITS,
    SIZE_LIMIT,
    SLOT_BITS_SHORT,
    SLOT_LIMIT_SHORT,
    message_id,
    pack_batch,
)
from engine.queue.stats import DUPLICATES, PUBLISHED
from engine.raft.state_machine import ApplyMeta, MachineEffect

if TYPE_CHECKING:
    from engine.queue.machine import QueueMachine

U64 = npt.NDArray[np.uint64]


def on_enqueue(
    m: QueueMachine, meta: ApplyMeta, command: bytes, effects: list[MachineEffect]
) -> object:
    """Reply ``Enqueued(ids, duplicate)`` for the whole batch, or ``Rejected``."""
    few = codec.enqueue_records_few(command)
    recs: npt.NDArray[np.void] | None = None
    frames: list[codec.Frame] = []
    if few is not None and len(few) == 1:  # the most common publish, kept lean
        body_len, headers_len, offset, dedup_len, _p, flags, *_ = few[0]
        n = 1
        size_max = bytes_total = body_len + headers_len
        sizes: list[int] | U64 = [size_max]
        keys = [(0, bytes(command[offset : offset + dedup_len]))] if dedup_len else []
        if flags & FLAG_FRAME:
            keys = []
            frames = codec.frames_at(command, [(0, offset, dedup_len)], [flags], [dedup_len])
    elif few is not None:
        sizes = [rec[0] + rec[1] for rec in few]
        n, size_max, bytes_total = len(few), max(sizes), sum(sizes)
        keys = [
            (k, bytes(command[rec[2] : rec[2] + rec[3]]))
            for k, rec in enumerate(few)
            if rec[3] and not rec[5] & FLAG_FRAME
        ]
        if any(rec[5] & FLAG_FRAME for rec in few):
            heads = [(k, r[2], r[3]) for k, r in enumerate(few) if r[5] & FLAG_FRAME]
            frames = codec.frames_at(command, heads, [r[5] for r in few], [r[3] for r in few])
    elif (bare := codec.enqueue_body_sizes(command)) is not None:
        n, size_max, bytes_total = len(bare), int(bare.max()), int(bare.sum())
        keys, sizes = [], bare
    else:
        recs = codec.enqueue_records(command)
        batch_sizes = recs["body_len"].astype(np.uint64) + recs["headers_len"].astype(np.uint64)
        n, size_max, bytes_total = len(recs), int(batch_sizes.max()), int(batch_sizes.sum())
        # The ids' places read as columns: a row of a structured array costs a
        # microsecond to index, more than the rest of a message's apply.
        flagged = recs["flags"] & FLAG_FRAME
        keyed = np.flatnonzero((recs["dedup_len"] != 0) & (flagged == 0))
        starts = recs["data_offset"][keyed]
        ends = starts + recs["dedup_len"][keyed]
        keys = [
            (k, bytes(command[a:b]))
            for k, a, b in zip(keyed.tolist(), starts.tolist(), ends.tolist(), strict=True)
        ]
        sizes = batch_sizes
        heads_at = np.flatnonzero(flagged)
        if len(heads_at):
            offsets, lens = recs["data_offset"][heads_at], recs["dedup_len"][heads_at]
            frames = codec.frames_at(
                command,
                list(zip(heads_at.tolist(), offsets.tolist(), lens.tolist(), strict=True)),
                recs["flags"].tolist(),
                recs["dedup_len"].tolist(),
            )
    if n > m._limits.batch_messages_max:
        return Rejected(
            MessageTooLarge, f"a batch holds at most {m._limits.batch_messages_max} messages"
        )
    if size_max > m.policy.max_message_bytes:
        return Rejected(
            MessageTooLarge, f"a message is larger than {m.policy.max_message_bytes} bytes"
        )
    index = meta.index
    # Slots are the low bits of an id: a batch's ids are one run of integers.
    first_id = message_id(index, 0)
    ids = list(range(first_id, first_id + n)) if n > 1 else [first_id]
    assert ids[-1] == message_id(index, n - 1)
    duplicate = [False] * n
    if keys or frames:
        m._dedup.prune(m._now_ms)
    if keys:
        m._dedup.find_duplicates(keys, ids, duplicate)
    if frames:
        frame_keys, frame_ids, frame_dup = _frame_duplicates(m, frames, ids, duplicate)
        dup_slots = [k for k in range(n) if duplicate[k]]
    else:
        dup_slots = [k for k, _key in keys if duplicate[k]] if keys else []
    dup_bytes = sum(int(sizes[k]) for k in dup_slots) if dup_slots else 0
    count_new = n - len(dup_slots)
    full = over_limits(m, count_new, bytes_total - dup_bytes)
    if full and m.policy.overflow == OVERFLOW_REJECT_PUBLISH:
        return Rejected(QueueFull, "the queue is at max_length or max_bytes")
    if keys:
        m._dedup.remember(keys, ids, duplicate, m._now_ms)
    if frames:
        m._dedup.frames().remember(frame_keys, frame_ids, frame_dup, m._now_ms)
    if m.policy.message_ttl_ms is not None:
        m._times.note(index, m._now_ms)
        m._deadline_known = False  # a new head's expiry
    if dup_slots:
        m._dead_bytes += dup_bytes + RECORD_BYTES * len(dup_slots)
        m._counters[DUPLICATES] += len(dup_slots)
    m._counters[PUBLISHED] += count_new
    if count_new and few is not None:
        _place_few(m, index, few, duplicate)
    elif count_new and recs is None:
        assert count_new == n and not isinstance(sizes, list)
        _place_bodies(m, index, sizes, bytes_total)
    elif count_new:
        assert recs is not None and not isinstance(sizes, list)
        _place_new(m, index, recs, sizes, duplicate)
    if full:
        drop_head(m, effects)
        m._deadline_known = False  # a new head, maybe a dead letter to retry
    return Enqueued(tuple(ids), tuple(duplicate))


def _frame_duplicates(
    m: QueueMachine, frames: list[codec.Frame], ids: list[int], duplicate: list[bool]
) -> tuple[list[tuple[int, bytes]], list[int], list[bool]]:
    """Mark every message of a frame whose id the window holds (or an earlier frame of
    the batch has) a duplicate, with the ids of the first frame's messages in order;
    the frames' keys, first ids and duplicate marks, for ``remember``."""
    keys = [(q, key) for q, (_k, _count, key) in enumerate(frames)]
    firsts = [ids[k] for k, _count, _key in frames]
    dup = [False] * len(frames)
    m._dedup.frames().find_duplicates(keys, firsts, dup)
    if True in dup:
        for (k, count, _key), repeat, first in zip(frames, dup, firsts, strict=True):
            if repeat:
                duplicate[k : k + count] = [True] * count
                ids[k : k + count] = range(first, first + count)
    return keys, firsts, dup


def _place_few(
    m: QueueMachine, index: int, records: list[codec.Record], duplicate: list[bool]
) -> None:
    """``_place_new`` for a few records, one by one with scalar arithmetic: the ref is
    what ``FallbackTable.pack`` gives (the first compact form, or a fallback handle)."""
    n = len(records)
    assert n <= SLOT_LIMIT_SHORT
    top = m.policy.priorities - 1
    lanes = m._lanes
    compact = index < INDEX_LIMIT_SHORT
    head = index << (SIZE_BITS + SLOT_BITS_SHORT)
    for k, (body_len, headers_len, _o, _d, priority, _f, ttl_ms, delay_ms) in enumerate(records):
        if duplicate[k]:
            continue
        size = body_len + headers_len
        if compact and size < SIZE_LIMIT:
            ref = head | (size << SLOT_BITS_SHORT) | k
        else:
            ref = m._fallback.pack(index, k, size, n)
        level = min(priority, top)
        if ttl_ms >= 0:
            m._own_expires_at()[ref] = m._now_ms + ttl_ms
            m._deadline_known = False
        if delay_ms > 0:
            m._delayed.push(m._now_ms + delay_ms, ref, level)
            m._bytes_delayed += size
            m._deadline_known = False
        else:
            lanes.main(level).push(ref)
            m._bytes_ready += size
            m._ready += 1


def _place_bodies(m: QueueMachine, index: int, sizes: U64, bytes_total: int) -> None:
    """``_place_new`` for messages that are their bodies alone (priority 0, no delay, no
    TTL, no dedup id): the refs at once, at the tail of level 0's main lane."""
    refs = pack_batch(index, sizes, m._fallback)
    m._lanes.main(0).push_many(refs)
    m._bytes_ready += bytes_total
    m._ready += len(refs)


def _place_new(
    m: QueueMachine, index: int, recs: npt.NDArray[np.void], sizes: U64, duplicate: list[bool]
) -> None:
    top = m.policy.priorities - 1
    prios = np.minimum(recs["priority"], top)
    simple = (
        not any(duplicate)
        and not recs["delay_ms"].any()
        and not (recs["ttl_ms"] >= 0).any()
        and (prios == prios[0]).all()
    )
    if simple:
        refs = pack_batch(index, sizes, m._fallback)
        m._lanes.main(int(prios[0])).push_many(refs)
        m._bytes_ready += int(sizes.sum())
        m._ready += len(refs)
        return
    m._deadline_known = False  # some have a TTL or a delay
    for k in [k for k, dup in enumerate(duplicate) if not dup]:
        size = int(sizes[k])
        ref = m._fallback.pack(index, k, size, len(sizes))
        level = int(prios[k])
        ttl_ms = int(recs["ttl_ms"][k])
        if ttl_ms >= 0:
            m._own_expires_at()[ref] = m._now_ms + ttl_ms
        delay_ms = int(recs["delay_ms"][k])
        if delay_ms > 0:
            m._delayed.push(m._now_ms + delay_ms, ref, level)
            m._bytes_delayed += size
        else:
            m._lanes.main(level).push(ref)
            m._bytes_ready += size
            m._ready += 1


__all__ = ["on_enqueue"]
