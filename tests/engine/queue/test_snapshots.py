"""Restoring a snapshot with the ready lanes as views into it, not copies."""

from __future__ import annotations

from array import array
from dataclasses import replace

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.limits import Limits
from engine.queue import (
    CheckedOut,
    Enqueued,
    MemoryUse,
    NewMessage,
    QueueMachine,
    QueuePolicy,
    encode_checkout,
    encode_enqueue,
    encode_expire,
    encode_purge,
    encode_return,
    encode_settle,
)
from engine.queue.snapshots import LANES_AT, SnapshotState, read_snapshot
from engine.raft.state_machine import ApplyMeta

NO_MEMORY = MemoryUse(0, 0, 0, 0, 0)
"""Memory estimates differ after a restore (pages come back unsealed)."""

LIMITS = Limits(page_refs=16)


def filled(
    counts: list[int], priorities: int = 1, taken: int = 0, **policy: object
) -> QueueMachine:
    """A machine with ``counts[k]`` messages published in entry ``k``, then ``taken``
    checked out, at increasing priority levels."""
    m = QueueMachine(QueuePolicy(priorities=priorities, **policy), LIMITS)  # type: ignore[arg-type]
    index = 0
    for k, n in enumerate(counts):
        index += 1
        batch = [NewMessage(b"x" * (k % 7), priority=k % priorities) for _ in range(n)]
        m.apply(ApplyMeta(index, 1, 1_000), encode_enqueue(batch))
    if taken:
        index += 1
        reply, _ = m.apply(ApplyMeta(index, 1, 1_000), encode_checkout("c", taken))
        assert isinstance(reply, CheckedOut)
    return m


def as_plain(state: list[object]) -> list[object]:
    lanes = state[LANES_AT]
    assert isinstance(lanes, list)
    return [
        *state[:LANES_AT],
        [[head, bytes(np.asarray(refs).tobytes())] for head, refs, _spilled in lanes],
        *state[LANES_AT + 1 :],
    ]


@pytest.mark.parametrize(
    ("counts", "priorities", "taken"),
    [
        ([], 1, 0),
        ([1], 1, 0),
        ([16], 1, 0),  # exactly one page
        ([16, 16], 1, 0),  # a whole number of pages
        ([100, 3, 1, 40], 1, 37),
        ([5] * 30, 10, 12),  # 20 lanes: a 16-bit array header
        ([300] * 3, 3, 250),
    ],
)
def test_read_snapshot_equals_msgpack(counts: list[int], priorities: int, taken: int) -> None:
    data = filled(counts, priorities, taken).snapshot()
    plain = msgpack.unpackb(data, raw=False, strict_map_key=False)
    # A small snapshot is unpacked whole (copied): the same fields.
    assert as_plain(read_snapshot(data)) == plain
    state = read_snapshot(data, whole_max=0)
    assert as_plain(state) == plain
    whole = np.frombuffer(data, dtype=np.uint8)
    for _head, refs, spilled in state[LANES_AT]:
        assert refs.dtype == np.uint64 and not refs.flags.writeable
        # A view into the snapshot, not a copy: the fast path read it (not msgpack).
        assert not len(refs) or np.shares_memory(refs, whole)
        assert spilled == []


def test_restored_machine_keeps_working_and_snapshots_alike() -> None:
    original = filled([100, 3, 1, 40, 16], priorities=2, taken=21)
    data = original.snapshot()
    restored = QueueMachine(QueuePolicy(), LIMITS)
    restored.restore(memoryview(data))
    assert restored.snapshot() == data
    # Only the memory estimate may differ: restored pages start at a page boundary.
    assert replace(restored.stats(), memory_bytes=0, memory=NO_MEMORY) == replace(
        original.stats(), memory_bytes=0, memory=NO_MEMORY
    )
    index = original.stats().last_applied
    for m in (original, restored):
        for k in range(1, 40):
            m.apply(ApplyMeta(index + k, 1, 2_000), encode_enqueue([NewMessage(b"y" * k)]))
        m.apply(ApplyMeta(index + 40, 1, 2_000), encode_checkout("c", 1000))
        m.check_invariants()
    assert restored.snapshot() == original.snapshot()
    assert restored.stats().messages_ready == 0


def test_a_snapshot_with_the_old_dedup_form_loads() -> None:
    """Snapshots written before the compact dedup window hold ``[expiry, id, first
    message id]`` per id: they load, and the ids in them are still duplicates."""
    m = QueueMachine(QueuePolicy(), LIMITS)
    batch = [NewMessage(b"x", dedup_id=b"id-%d" % k) for k in range(20)]
    reply, _ = m.apply(ApplyMeta(1, 1, 1_000), encode_enqueue(batch))
    assert isinstance(reply, Enqueued)
    state = msgpack.unpackb(m.snapshot(), raw=False, strict_map_key=False)
    at = SnapshotState._fields.index("dedup")
    expiry = 1_000 + LIMITS.dedup_window_ms
    state[at] = [[expiry, b"id-%d" % k, reply.ids[k]] for k in range(20)]
    old = bytes(msgpack.packb(state, use_bin_type=True))
    restored = QueueMachine(QueuePolicy(), LIMITS)
    restored.restore(old)
    restored.check_invariants()
    assert restored.snapshot() == m.snapshot()
    again, _ = restored.apply(ApplyMeta(2, 1, 2_000), encode_enqueue(batch[::-1]))
    assert again == Enqueued(reply.ids[::-1], (True,) * 20)


def test_a_snapshot_with_a_long_prefix_falls_back_to_msgpack() -> None:
    m = filled([10, 20], dead_letter_queue="q" * 70_000)
    data = m.snapshot()
    restored = QueueMachine(QueuePolicy(), LIMITS)
    restored.restore(data)
    assert restored.snapshot() == data
    assert as_plain(read_snapshot(data)) == msgpack.unpackb(data, raw=False, strict_map_key=False)


_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("enqueue"), st.integers(1, 40), st.integers(0, 2)),
        st.tuples(st.just("checkout"), st.integers(1, 40), st.just(0)),
        st.tuples(st.just("settle"), st.integers(1, 40), st.just(0)),
        st.tuples(st.just("return"), st.integers(1, 40), st.just(0)),
        st.tuples(st.just("purge"), st.just(0), st.just(0)),
    ),
    max_size=25,
)


def _run(m: QueueMachine, steps: list[tuple[str, int, int]], index: int) -> int:
    held: list[tuple[int, int]] = []
    for kind, n, priority in steps:
        index += 1
        meta = ApplyMeta(index, 1, 1_000 + index)
        if kind == "enqueue":
            m.apply(meta, encode_enqueue([NewMessage(b"m" * (index % 5), priority=priority)] * n))
        elif kind == "checkout":
            reply, _ = m.apply(meta, encode_checkout("c", n, 60_000))
            assert isinstance(reply, CheckedOut)
            held.extend(zip(reply.tags, reply.refs, strict=True))
        elif kind in ("settle", "return"):
            some, held = held[:n], held[n:]
            encode = encode_settle if kind == "settle" else encode_return
            m.apply(meta, encode(some))
        else:
            m.apply(meta, encode_purge())
    return index


@settings(max_examples=60, deadline=None)
@given(_STEPS, _STEPS)
def test_a_frozen_machine_keeps_the_state_of_its_moment(
    before: list[tuple[str, int, int]], after: list[tuple[str, int, int]]
) -> None:
    """``freeze`` shares the ready pages instead of copying them; whatever the machine
    applies afterwards (pages filled, popped, sealed, expanded, purged), the frozen state
    still encodes to the snapshot and live set of its moment."""
    m = QueueMachine(QueuePolicy(priorities=3), LIMITS)
    index = _run(m, before, 0)
    expected_state, expected_live = m.snapshot(), m.live_indexes()
    frozen = m.freeze()
    _run(m, after, index)
    assert frozen.encode() == expected_state
    assert frozen.live_indexes() == expected_live
    restored = QueueMachine(QueuePolicy(), LIMITS)
    restored.restore(frozen.encode())
    assert restored.live_indexes() == expected_live


def test_a_format_1_snapshot_restores_with_its_one_second_samples() -> None:
    """Checkpoints written before format 2 kept (index, ms) samples one second apart:
    they restore, with the bound they had (never early), and the queue goes on exactly."""
    m = filled([2, 3], message_ttl_ms=500)
    state = msgpack.unpackb(m.snapshot(), raw=False, strict_map_key=False)
    assert state[0] == QueueMachine.version == 2
    state[0] = 1
    state[12] = [array("q", [1]).tobytes(), array("q", [1_000]).tobytes()]
    old = QueueMachine(QueuePolicy(), LIMITS)
    old.restore(msgpack.packb(state, use_bin_type=True))
    assert old.next_deadline_ms() == 1_000 + 999 + 500
    old.apply(ApplyMeta(3, 1, 1_600), encode_enqueue([NewMessage(b"new")]))
    old.apply(ApplyMeta(4, 1, 2_100), encode_enqueue([NewMessage(b"newer")]))
    old.apply(ApplyMeta(5, 1, 2_498), encode_expire())
    assert old.stats().messages_ready == 7
    # Entry 3 cannot be given a bound before entry 2's (1,999): 399 ms late, once.
    old.apply(ApplyMeta(6, 1, 2_499), encode_expire())
    assert old.stats().messages_ready == 1
    assert old.next_deadline_ms() == 2_600  # exact again
    again = QueueMachine(QueuePolicy(), LIMITS)
    again.restore(old.snapshot())
    assert again.snapshot() == old.snapshot()
