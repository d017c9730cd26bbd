"""The machine's fast paths for small commands against its general (numpy) paths.

A publish batch of a few messages, a checkout of a few and a settle, return, discard or
extend of a few receipts are handled one by one with ``struct`` and scalar arithmetic;
larger ones with numpy. Each test applies the same commands, at the same indexes and
times, to two machines, one of them with the fast paths switched off, and asserts after
every step that replies, effects, snapshots, stats and the ready order are equal.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from engine.errors import InvalidRequest, MessageTooLarge, QueueFull
from engine.limits import Limits
from engine.queue import (
    CheckedOut,
    Enqueued,
    NewMessage,
    QueueMachine,
    QueuePolicy,
    Rejected,
    Settled,
    encode_checkout,
    encode_discard,
    encode_enqueue,
    encode_expire,
    encode_extend,
    encode_policy,
    encode_return,
    encode_settle,
    message_id,
)
from engine.queue import checkout as checkout_module
from engine.queue import commands as cmd
from engine.queue import enqueue_codec as codec
from engine.queue.refs import INDEX_LIMIT_SHORT, SIZE_LIMIT, SLOTS_PER_ENTRY_MAX, is_fallback
from engine.raft.state_machine import ApplyMeta


@contextmanager
def general_paths_only() -> Iterator[None]:
    saved = (
        codec.ENQUEUE_FEW_MAX,
        codec.ENQUEUE_BODIES_MIN,
        cmd.RECEIPTS_FEW_MAX,
        checkout_module._CHECKOUT_FEW_MAX,
    )
    (
        codec.ENQUEUE_FEW_MAX,
        codec.ENQUEUE_BODIES_MIN,
        cmd.RECEIPTS_FEW_MAX,
        checkout_module._CHECKOUT_FEW_MAX,
    ) = (0, SLOTS_PER_ENTRY_MAX + 1, -1, 0)
    try:
        yield
    finally:
        (
            codec.ENQUEUE_FEW_MAX,
            codec.ENQUEUE_BODIES_MIN,
            cmd.RECEIPTS_FEW_MAX,
            checkout_module._CHECKOUT_FEW_MAX,
        ) = saved


class Twin:
    """Two machines, fast paths on and off, driven in step."""

    def __init__(self, limits: Limits | None = None, index: int = 0, **policy: Any) -> None:
        limits = limits or Limits()
        self.fast = QueueMachine(QueuePolicy(**policy), limits)
        self.general = QueueMachine(QueuePolicy(**policy), limits)
        self.index = index
        self.now = 1_000
        self.receipts: list[tuple[int, int]] = []

    def apply(self, command: bytes) -> Any:
        self.index += 1
        meta = ApplyMeta(self.index, 1, self.now)
        got = self.fast.apply(meta, command)
        with general_paths_only():
            expected = self.general.apply(meta, command)
        assert got == expected
        self.fast.check_invariants()
        assert self.fast.snapshot() == self.general.snapshot()
        assert self.fast.stats() == self.general.stats()
        assert self.fast.browse(None, 1000) == self.general.browse(None, 1000)
        assert self.fast.next_deadline_ms() == self.general.next_deadline_ms()
        assert self.fast.live_indexes() == self.general.live_indexes()
        reply = got[0]
        if isinstance(reply, CheckedOut):
            self.receipts += zip(reply.tags, reply.refs, strict=True)
        return reply

    def publish(self, *messages: NewMessage) -> Any:
        return self.apply(encode_enqueue(list(messages)))

    def take(self, n: int, consumer: str = "c", lease_ms: int = 0) -> CheckedOut:
        reply = self.apply(encode_checkout(consumer, n, lease_ms))
        assert isinstance(reply, CheckedOut)
        return reply


def msg(size: int = 10, **kw: Any) -> NewMessage:
    return NewMessage(b"x" * size, **kw)


def test_the_switch_reaches_the_general_paths() -> None:
    one = encode_enqueue([msg()])
    assert codec.enqueue_records_few(one) is not None
    assert cmd.decode_receipts_few(encode_settle([(1, 2)])) is not None
    bodies = encode_enqueue([b"x"] * codec.ENQUEUE_BODIES_MIN)
    assert codec.enqueue_body_sizes(bodies) is not None
    with general_paths_only():
        assert codec.enqueue_records_few(one) is None
        assert cmd.decode_receipts_few(encode_settle([(1, 2)])) is None
        assert codec.enqueue_body_sizes(bodies) is None


def test_batches_of_bodies_alone_agree_with_their_records() -> None:
    """Batches past ``ENQUEUE_FEW_MAX`` whose messages are all bodies alone (read by
    ``enqueue_body_sizes``), next to batches where one message is not."""
    t = Twin(max_message_bytes=50_000, max_length=2_500, overflow="drop-head")
    n = codec.ENQUEUE_BODIES_MIN
    t.publish(*[msg(k) for k in range(n)])
    t.apply(encode_enqueue([b"b" * k for k in range(100)]))
    t.apply(encode_enqueue([b"", b"c" * SIZE_LIMIT, b"d" * 40_000] * 10))  # fallback refs
    for odd in (msg(priority=1), msg(headers=b"h"), msg(ttl_ms=5), msg(delay_ms=5)):
        t.publish(*[msg() for _ in range(n - 1)], odd)
    t.publish(*[msg(dedup_id=b"k")] * n)
    assert t.take(300).tags
    t.apply(encode_enqueue([b"e" * 7] * 1000))
    t.apply(encode_enqueue([b"f"] * 1000))  # past max_length: the head is dropped
    t.take(1000)
    reject = Twin(max_length=30)
    assert isinstance(reject.apply(encode_enqueue([b"g"] * 31)), Rejected)
    too_large = Twin(max_message_bytes=10)
    reply = too_large.apply(encode_enqueue([b"h"] * 20 + [b"i" * 11]))
    assert isinstance(reply, Rejected) and reply.error is MessageTooLarge


def test_single_messages_and_the_batch_size_boundary() -> None:
    t = Twin()
    assert t.publish(msg()) == Enqueued((1024,), (False,))
    assert t.publish(*[msg(k) for k in range(codec.ENQUEUE_FEW_MAX)]).ids[-1] == 2048 + 15
    t.publish(*[msg(k) for k in range(codec.ENQUEUE_FEW_MAX + 1)])
    t.publish(msg(0), msg(headers=b"hh"))
    for n in (1, 2, 16, 17, 1):
        t.take(n)
    t.take(100)


def test_dedup_in_and_across_batches_window_and_capacity() -> None:
    t = Twin(Limits(dedup_ids_max=2, dedup_window_ms=1000))
    a, b, c = (msg(dedup_id=k) for k in (b"a", b"b", b"c"))
    assert t.publish(a, a, msg()) == Enqueued((1024, 1024, 1026), (False, True, False))
    assert t.publish(a) == Enqueued((1024,), (True,))
    t.publish(b, c)  # the capacity of 2 forgets "a" early
    assert t.publish(a) == Enqueued((4 * 1024,), (False,))
    t.now += 1000  # the window passed
    assert t.publish(b, msg(dedup_id=b"b", size=3)) == Enqueued((5120, 5120), (False, True))


def test_message_ttl_queue_ttl_and_delay() -> None:
    t = Twin(dead_letter_queue="dlq", priorities=2)
    t.publish(msg(ttl_ms=0), msg(ttl_ms=500, priority=1), msg(delay_ms=300))
    t.publish(msg(ttl_ms=100, delay_ms=50))
    t.take(1)
    t.now += 60
    t.apply(encode_expire())
    t.now += 400
    t.take(2)
    t.apply(encode_policy({"message_ttl_ms": 200}))
    t.publish(msg(), msg(priority=1))
    t.now += 2_000
    t.take(1)
    t.apply(encode_expire())


def test_priorities_are_clamped_and_returns_go_first() -> None:
    t = Twin(priorities=3, delivery_limit=2)
    t.publish(msg(priority=0), msg(priority=9), msg(priority=1))
    t.publish(msg(priority=2))
    first = t.take(2)
    t.apply(encode_return(list(zip(first.tags, first.refs, strict=True))))
    t.take(1)
    again = t.take(3)
    t.apply(encode_return([(again.tags[0], again.refs[0])]))  # second delivery: limit
    t.take(5)


@pytest.mark.parametrize("overflow", ["reject-publish", "drop-head"])
def test_length_and_byte_limits(overflow: str) -> None:
    t = Twin(max_length=3, max_bytes=100, overflow=overflow, dead_letter_queue="dlq")
    t.publish(msg(20), msg(20))
    reply = t.publish(msg(20), msg(20))
    if overflow == "reject-publish":
        assert isinstance(reply, Rejected) and reply.error is QueueFull
    t.publish(msg(90))
    t.publish(msg(5, delay_ms=100))
    t.publish(msg(5, dedup_id=b"k"), msg(5, dedup_id=b"k"))


def test_fallback_refs_for_large_messages_and_high_indexes() -> None:
    t = Twin(max_message_bytes=50_000, index=INDEX_LIMIT_SHORT - 3)
    t.publish(msg(SIZE_LIMIT - 1), msg(SIZE_LIMIT), msg(40_000))
    t.publish(msg(3))  # index 2^44 - 1: still the compact form
    t.publish(msg(4))  # index 2^44: fallback
    t.publish(msg(5), msg(SIZE_LIMIT))
    assert sum(is_fallback(item.ref) for item in t.fast.browse(None, 100)) == 5
    got = t.take(3)
    t.apply(encode_settle(list(zip(got.tags, got.refs, strict=True))))
    t.take(4)


def test_max_message_bytes_and_batch_messages_max() -> None:
    t = Twin(Limits(batch_messages_max=2), max_message_bytes=100)
    reply = t.publish(msg(101))
    assert isinstance(reply, Rejected) and reply.error is MessageTooLarge
    assert isinstance(t.publish(msg(1), msg(100), msg(1)), Rejected)
    assert isinstance(t.publish(msg(1), msg(101)), Rejected)
    t.publish(msg(100), msg(0))


def test_malformed_entries_are_rejected_alike() -> None:
    t = Twin()
    good = encode_enqueue([msg(), msg()])
    bad_offset = bytearray(good)
    struct.pack_into("<I", bad_offset, 4 + 8, len(good))
    zero = struct.pack("<BBH", ord("E"), 1, 0)
    bare = encode_enqueue([b"x"] * codec.ENQUEUE_BODIES_MIN)
    bare_offset = bytearray(bare)
    struct.pack_into("<I", bare_offset, 4 + 32 * 5 + 8, len(bare))
    malformed = (good[:3], good[:40], good[:-1], bytes(bad_offset), zero, bare[:-1])
    for command in (*malformed, bare[:100], bytes(bare_offset)):
        reply = t.apply(command)
        assert isinstance(reply, Rejected) and reply.error is InvalidRequest
    settle = encode_settle([(1, 2)])
    for command in (settle[:-1], settle[:5], settle + b"x", encode_extend([(1, 2)], 5)[:-3]):
        reply = t.apply(command)
        assert isinstance(reply, Rejected) and reply.error is InvalidRequest


def test_receipts_one_by_one_match_the_vectorised_match() -> None:
    t = Twin(dead_letter_queue="dlq", lease_ms=1000)
    t.publish(*[msg(k) for k in range(10)])
    got = t.take(6)
    pairs = list(zip(got.tags, got.refs, strict=True))
    (t1, r1), (t2, r2), (t3, r3), (t4, r4), (t5, r5), (t6, r6) = pairs
    reply = t.apply(encode_settle([(t1, r1), (t1, r1), (t2, r2 ^ 1), (99, r3), (t2, r2)]))
    assert reply == Settled(2, (1, 2, 3))
    assert t.apply(encode_settle([(t1, r1)])) == Settled(0, (0,))
    t.apply(encode_return([(t3, r3)]))
    t.apply(encode_discard([(t4, r4), (t4, r4)]))
    t.apply(encode_extend([(t5, r5)], 5_000))
    t.apply(encode_extend([(t6, r6), (t5, r5)], 0))
    t.now += 1_000
    t.apply(encode_expire())
    t.now += 5_000
    t.apply(encode_expire())


def test_many_receipts_in_order_of_one_checkout_or_several_and_out_of_order() -> None:
    """Settles of more than the few: receipts in delivery order (no repeat to look for;
    one lease group or two), and the same with a repeat and out of order."""
    t = Twin(lease_ms=1000)
    t.publish(*[msg(k) for k in range(120)])
    a, b, c = t.take(30), t.take(30), t.take(30)
    pairs_a = list(zip(a.tags, a.refs, strict=True))
    pairs_b = list(zip(b.tags, b.refs, strict=True))
    pairs_c = list(zip(c.tags, c.refs, strict=True))
    assert t.apply(encode_settle(pairs_a[:20])) == Settled(20, ())
    assert t.apply(encode_settle(pairs_a[20:] + pairs_b[:10])) == Settled(20, ())
    repeated = [*pairs_c[::-1], pairs_c[3], pairs_a[0], *pairs_b[10:]]
    assert t.apply(encode_settle(repeated)) == Settled(50, (30, 31))
    assert t.fast.stats().acked == 90
    assert t.apply(encode_settle(pairs_b)) == Settled(0, tuple(range(30)))
    assert len(t.take(40).tags) == 30  # what was never checked out


@pytest.mark.parametrize("seed", range(6))
def test_random_small_commands_agree(seed: int) -> None:
    _random_run(random.Random(seed))


def _random_run(rng: random.Random) -> None:
    t = Twin(
        Limits(page_refs=16, dedup_ids_max=5, dead_letter_retry_ms=500),
        priorities=3,
        delivery_limit=3,
        lease_ms=800,
        max_length=rng.choice([None, 30]),
        overflow=rng.choice(["reject-publish", "drop-head"]),
        dead_letter_queue=rng.choice([None, "dlq"]),
        max_message_bytes=50_000,
    )
    for _ in range(300):
        op = rng.random()
        if op < 0.4:
            n = rng.choice([1, 1, 1, 2, 3, 16, 17])
            t.publish(*[_random_message(rng) for _ in range(n)])
        elif op < 0.65:
            t.take(rng.choice([1, 1, 2, 5, 16, 17, 40]), rng.choice(["a", "b"]))
        elif op < 0.9 and t.receipts:
            chosen = [rng.choice(t.receipts) for _ in range(rng.choice([1, 1, 2, 4, 17]))]
            verb = rng.choice([encode_settle, encode_return, encode_discard])
            if rng.random() < 0.2:
                t.apply(encode_extend(chosen, rng.choice([0, 300])))
            else:
                t.apply(verb(chosen))
        else:
            t.now += rng.choice([0, 100, 500, 1_000])
            t.apply(encode_expire())
    assert t.fast.stats().published > 0


def _random_message(rng: random.Random) -> NewMessage:
    return NewMessage(
        b"y" * rng.choice([0, 1, 50, 200, SIZE_LIMIT]),
        priority=rng.randrange(4),
        ttl_ms=rng.choice([None, None, None, 0, 700]),
        delay_ms=rng.choice([0, 0, 0, 300]),
        dedup_id=rng.choice([None, None, b"p", b"q", b"r"]),
    )


def test_message_ids_of_a_fast_publish() -> None:
    t = Twin()
    reply = t.publish(msg(), msg(), msg())
    assert reply.ids == tuple(message_id(1, k) for k in range(3))
