"""The compact dedup window against the dict-and-deque window it replaced, kept here as
the oracle: batches with many repeated ids, clock jumps, small ``ids_max``, and
checkpoint round trips (the new form and the old list form) in the middle of a run.

Frame ids (one id for a run of messages) are kept in a window of their own, driven here
beside the message ids against an oracle of their own: the checkpoint then holds both
(its form 3), and an old form of either part still loads.

A second run gives every id one of three hashes, so that the table's candidates are
nearly all false and only the full comparison of ids tells a duplicate.
"""

from __future__ import annotations

import gc
import os
import tracemalloc
from collections import deque
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

import engine.queue.dedup as dedup_module
from engine.limits import Limits
from engine.queue import NewMessage, QueueMachine, QueuePolicy, encode_enqueue
from engine.queue.dedup import DedupWindow
from engine.queue.dedup_table import U64
from engine.raft.state_machine import ApplyMeta

EXAMPLES = int(os.environ.get("QUORRA_QUEUE_EXAMPLES", "150"))


class OracleWindow:
    """The window as it was: a dict of id -> first message id and a deque in order."""

    def __init__(self, window_ms: int, ids_max: int) -> None:
        self.window_ms = window_ms
        self.ids_max = ids_max
        self.first_ids: dict[bytes, int] = {}
        self.order: deque[tuple[int, bytes]] = deque()

    def prune(self, now_ms: int) -> None:
        while self.order and self.order[0][0] <= now_ms:
            _expiry, key = self.order.popleft()
            del self.first_ids[key]

    def find_duplicates(
        self, keys: list[tuple[int, bytes]], ids: list[int], duplicate: list[bool]
    ) -> None:
        seen: dict[bytes, int] = {}
        for k, key in keys:
            first = self.first_ids.get(key, seen.get(key))
            if first is not None:
                duplicate[k] = True
                ids[k] = first
            else:
                seen[key] = ids[k]

    def remember(
        self, keys: list[tuple[int, bytes]], ids: list[int], duplicate: list[bool], now_ms: int
    ) -> None:
        for k, key in keys:
            if duplicate[k]:
                continue
            self.first_ids[key] = ids[k]
            self.order.append((now_ms + self.window_ms, key))
            if len(self.first_ids) > self.ids_max:
                _old, old_key = self.order.popleft()
                del self.first_ids[old_key]

    def to_wire(self) -> list[list[object]]:
        """The old checkpoint form: ``[expiry, id, first id]`` per id, oldest first."""
        return [[expiry, key, self.first_ids[key]] for expiry, key in self.order]


def _round_trip(wire: list[Any]) -> list[Any]:
    """``wire`` as a checkpoint stores and reads it."""
    out: list[Any] = msgpack.unpackb(msgpack.packb(wire, use_bin_type=True), raw=False)
    return out


ids_pool = st.one_of(
    st.sampled_from([b"a", b"b", b"c", b"order-1", b"order-2", b"\x00", b"x" * 255]),
    st.binary(min_size=1, max_size=12),
)
batches = st.lists(st.one_of(st.none(), ids_pool), min_size=1, max_size=40)


class WindowVsOracle(RuleBasedStateMachine):
    @initialize(window_ms=st.integers(1, 50), ids_max=st.integers(1, 40))
    def start(self, window_ms: int, ids_max: int) -> None:
        self.window = DedupWindow(window_ms, ids_max)
        self.oracle = OracleWindow(window_ms, ids_max)
        self.frame_oracle = OracleWindow(window_ms, ids_max)
        self.limits = (window_ms, ids_max)
        self.now_ms = 0
        self.next_id = 1024

    @rule(batch=batches, step_ms=st.one_of(st.integers(0, 3), st.integers(0, 200)))
    def publish(self, batch: list[bytes | None], step_ms: int) -> None:
        """One enqueue as ``engine.queue.enqueue`` makes it: prune, look up, remember."""
        self.now_ms += step_ms
        keys = [(k, key) for k, key in enumerate(batch) if key is not None]
        replies = []
        for w in (self.window, self.oracle):
            ids = list(range(self.next_id, self.next_id + len(batch)))
            duplicate = [False] * len(batch)
            if keys:
                w.prune(self.now_ms)  # the window's prune prunes its frame ids too
                if w is self.oracle:
                    self.frame_oracle.prune(self.now_ms)
                w.find_duplicates(keys, ids, duplicate)
                w.remember(keys, ids, duplicate, self.now_ms)
            replies.append((ids, duplicate))
        assert replies[0] == replies[1]
        self.next_id += 1024

    @rule(batch=st.lists(ids_pool, min_size=1, max_size=8), step_ms=st.integers(0, 30))
    def publish_frames(self, batch: list[bytes], step_ms: int) -> None:
        """An enqueue of frames as ``engine.queue.enqueue`` makes it: the frame ids'
        window pruned with the message ids', looked up and remembered with each frame's
        first message id."""
        self.now_ms += step_ms
        keys = list(enumerate(batch))
        firsts = [self.next_id + 7 * q for q in range(len(batch))]
        replies = []
        for w, frames in ((self.window, self.window.frames()), (self.oracle, self.frame_oracle)):
            ids, duplicate = list(firsts), [False] * len(batch)
            w.prune(self.now_ms)
            frames.prune(self.now_ms)
            frames.find_duplicates(keys, ids, duplicate)
            frames.remember(keys, ids, duplicate, self.now_ms)
            replies.append((ids, duplicate))
        assert replies[0] == replies[1]
        self.next_id += 1024

    @rule()
    def restore_from_checkpoint(self) -> None:
        restored = DedupWindow(*self.limits)
        restored.adopt(_round_trip(self.window.to_wire()))
        assert restored.to_wire() == self.window.to_wire()
        self.window = restored

    @rule()
    def restore_from_old_checkpoint(self) -> None:
        """A checkpoint written before the compact form loads into the same window."""
        restored = DedupWindow(*self.limits)
        old: list[Any] = self.oracle.to_wire()
        if self.frame_oracle.first_ids:  # the form 3 around old forms of its parts
            old = [dedup_module.WIRE_FRAMES, old, self.frame_oracle.to_wire()]
        restored.adopt(_round_trip(old))
        assert restored.to_wire() == self.window.to_wire()
        self.window = restored

    @invariant()
    def same_window(self) -> None:
        self.window.check()
        assert len(self.window) == len(self.oracle.first_ids)
        assert self.window.frame_count() == len(self.frame_oracle.first_ids)
        held = len(self.window) + self.window.frame_count()
        assert (self.window.nbytes() == 0) == (held == 0)
        wire = self.window.to_wire()
        assert (wire[:1] == [dedup_module.WIRE_FRAMES]) == (self.window.frame_count() > 0)


WindowVsOracle.TestCase.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestWindowVsOracle = WindowVsOracle.TestCase


def _three_hashes(ids: list[bytes]) -> U64:
    return np.array([len(i) % 3 for i in ids], dtype=np.uint64)


def test_ids_of_one_hash_are_told_apart_by_their_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dedup_module, "hash_ids", _three_hashes)
    run_state_machine_as_test(WindowVsOracle, settings=WindowVsOracle.TestCase.settings)


@settings(max_examples=20, deadline=None)
@given(st.integers(1000, 3000))
def test_a_deep_window_round_trips(n: int) -> None:
    """A window past the scalar paths and a few rebuilds of its table: every id is found
    again after a checkpoint, with its first message id."""
    w = DedupWindow(10_000, n)
    keys = [(k, b"id-%d" % k) for k in range(n)]
    ids = list(range(n))
    w.remember(keys, ids, [False] * n, 0)
    restored = DedupWindow(10_000, n)
    restored.adopt(_round_trip(w.to_wire()))
    restored.check()
    again, duplicate = [-1] * n, [False] * n
    restored.find_duplicates(keys, again, duplicate)
    assert all(duplicate) and again == ids


def test_a_window_that_shrinks_gives_its_memory_back() -> None:
    """After a burst has expired, the next batches find the window's arrays and table
    sized for the burst and make them small again; the ids left are still found."""
    w = DedupWindow(1_000, 100_000)
    burst = [(k, b"burst-%d" % k) for k in range(50_000)]
    w.remember(burst, list(range(50_000)), [False] * 50_000, 0)
    deep_bytes = w.nbytes()
    for t, now_ms in enumerate([500, 1_000, 1_001, 1_002]):
        batch = [(k, b"late-%d-%d" % (t, k)) for k in range(500)]
        w.prune(now_ms)
        w.remember(batch, list(range(500)), [False] * 500, now_ms)
    w.check()
    assert len(w) == 2_000
    assert w.nbytes() < deep_bytes / 10
    keys = [(0, b"late-0-7"), (1, b"burst-7")]
    ids, duplicate = [-1, -1], [False, False]
    w.find_duplicates(keys, ids, duplicate)
    assert duplicate == [True, False] and ids == [7, -1]


def test_a_deep_window_is_compact_and_memory_bytes_says_so() -> None:
    """A queue that remembers 20,000 ids of 36 bytes holds at most 64 bytes per id beside
    the id itself and its message's ref and page (the dict and deque it replaced held
    about 210), and ``memory_bytes`` counts the window as it is
    (within a tenth of what tracemalloc sees)."""
    m = QueueMachine(QueuePolicy(), Limits())
    m.apply(ApplyMeta(1, 1, 1_000), encode_enqueue([NewMessage(b"warm")]))
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        estimate_before = m.stats().memory_bytes
        for e in range(20):
            batch = [NewMessage(b"x", dedup_id=b"%036d" % (e * 1000 + k)) for k in range(1000)]
            m.apply(ApplyMeta(2 + e, 1, 1_000 + e), encode_enqueue(batch))
        del batch
        gc.collect()
        measured = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    estimate = m.stats().memory_bytes - estimate_before
    assert measured / 20_000 <= 64 + 36 + 16, measured / 20_000
    assert abs(estimate - measured) <= measured / 10, (estimate, measured)


def test_a_batch_without_ids_leaves_the_window_empty() -> None:
    w = DedupWindow(1_000, 10)
    w.find_duplicates([], [1024], [False])
    w.remember([], [1024], [False], 0)
    w.check()
    assert len(w) == 0 and w.nbytes() == 0 and w.to_wire() == []
