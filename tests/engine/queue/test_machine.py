"""One test per semantic of the queue machine, asserting whole replies and effects."""

from __future__ import annotations

import gc
import tracemalloc
from dataclasses import replace
from typing import Any

import pytest

from engine.errors import MessageTooLarge, QueueConflict, QueueFull, ValidationFailed
from engine.limits import Limits
from engine.queue import (
    CheckedOut,
    DeadLetter,
    DeadLetterConfirmed,
    Delivery,
    Enqueued,
    Expired,
    MemoryUse,
    MessagesAvailable,
    NewMessage,
    PolicyChanged,
    Purged,
    QueueMachine,
    QueuePolicy,
    Rejected,
    Settled,
    SettledCheckedOut,
    encode_checkout,
    encode_dead_letter_confirm,
    encode_discard,
    encode_enqueue,
    encode_expire,
    encode_extend,
    encode_policy,
    encode_purge,
    encode_return,
    encode_settle,
    encode_settle_checkout,
    message_id,
)
from engine.raft.state_machine import ApplyMeta, CheckpointRequest, ReleaseCursor

NO_MEMORY = MemoryUse(0, 0, 0, 0, 0)
"""Memory estimates differ after a restore (pages come back unsealed)."""


class Q:
    """A machine with an index counter and a settable clock."""

    def __init__(self, limits: Limits | None = None, **policy: Any) -> None:
        self.machine = QueueMachine(QueuePolicy(**policy), limits or Limits())
        self.index = 0
        self.now = 1_000

    def apply(self, command: bytes) -> tuple[Any, list[Any]]:
        self.index += 1
        return self.machine.apply(ApplyMeta(self.index, 1, self.now), command)

    def publish(self, *bodies: bytes, **kw: Any) -> Any:
        reply, _ = self.apply(encode_enqueue([NewMessage(b, **kw) for b in bodies]))
        return reply

    def take(self, n: int = 10, consumer: str = "c", lease_ms: int = 0) -> list[Delivery]:
        reply, _ = self.apply(encode_checkout(consumer, n, lease_ms))
        assert isinstance(reply, CheckedOut)
        return list(reply.deliveries)

    def bodies(self, deliveries: list[Delivery]) -> list[int]:
        """Public message ids of deliveries."""
        out = []
        for d in deliveries:
            parts = self.machine.ref_parts(d.ref)
            out.append(message_id(parts.index, parts.slot))
        return out


def receipts(deliveries: list[Delivery]) -> list[tuple[int, int]]:
    return [(d.tag, d.ref) for d in deliveries]


def test_publish_checkout_settle() -> None:
    q = Q()
    reply, effects = q.apply(encode_enqueue([NewMessage(b"a"), NewMessage(b"bb", b"h")]))
    assert reply == Enqueued((1024, 1025), (False, False))
    assert effects == [MessagesAvailable(2)]
    got = q.take()
    assert [(d.tag, d.priority, d.delivery_count) for d in got] == [(1, 0, 1), (2, 0, 1)]
    assert q.bodies(got) == [1024, 1025]
    s = q.machine.stats()
    assert (s.messages_ready, s.messages_unacked, s.bytes_unacked, s.consumers) == (
        0,
        2,
        4,
        {"c": 2},
    )
    reply, effects = q.apply(encode_settle(receipts(got)))
    assert (reply, effects) == (Settled(2, ()), [])
    s = q.machine.stats()
    assert (s.messages_unacked, s.acked, s.delivered, s.published) == (0, 2, 2, 2)
    assert list(q.machine.live_indexes()) == []


def test_a_receive_carrying_acks_settles_then_checks_out_in_one_entry() -> None:
    """The same replies, leases and counts as a settle and a checkout one after the
    other; a forged receipt (right tag, wrong ref) is stale by its position."""
    one, two = Q(lease_ms=1000), Q(lease_ms=1000)
    for q in (one, two):
        q.publish(*[bytes([65 + k]) for k in range(5)])
        q.now += 10
    first = one.take(2)
    assert two.take(2) == first
    acks = [*receipts(first), (first[0].tag, first[0].ref ^ 1)]
    reply, effects = one.apply(encode_settle_checkout(acks, "c", 2, 500))
    assert effects == []
    settled, _ = two.apply(encode_settle(acks))
    checked_out, _ = two.apply(encode_checkout("c", 2, 500))
    assert (
        reply
        == SettledCheckedOut(settled, checked_out)
        == SettledCheckedOut(
            Settled(2, (2,)),
            CheckedOut((3, 4), checked_out.refs, (0, 0), (1, 1), one.now + 500),
        )
    )
    assert one.bodies(list(reply.checked_out.deliveries)) == [1026, 1027]
    a, b = one.machine.stats(), two.machine.stats()
    assert (a.messages_ready, a.messages_unacked, a.acked, a.delivered) == (1, 2, 2, 4)
    assert (a.messages_ready, a.messages_unacked, a.acked, a.delivered) == (
        b.messages_ready,
        b.messages_unacked,
        b.acked,
        b.delivered,
    )
    assert one.machine.pending_items() == two.machine.pending_items()


def test_a_receive_carrying_an_ended_lease_reports_it_stale_and_redelivers_it() -> None:
    """The lease of the acked message ended (the leader's timer) before the entry: the
    ack is stale, and the checkout of the same entry hands the message out again, one
    delivery more."""
    q = Q(lease_ms=1000)
    q.publish(b"a")
    [first] = q.take()
    q.now += 1000
    assert q.apply(encode_expire())[0] == Expired(1, 0, 0)
    reply, effects = q.apply(encode_settle_checkout(receipts([first]), "c", 10))
    assert effects == []
    assert isinstance(reply, SettledCheckedOut)
    assert reply.settled == Settled(0, (0,))
    [again] = reply.checked_out.deliveries
    assert (again.ref, again.tag, again.delivery_count) == (first.ref, 2, 2)
    assert q.machine.stats().acked == 0


def test_a_receive_carrying_acks_on_an_empty_queue_still_settles() -> None:
    q = Q()
    q.publish(b"a", b"b")
    got = q.take()
    reply, effects = q.apply(encode_settle_checkout(receipts(got), "c", 10))
    assert (reply, effects) == (
        SettledCheckedOut(Settled(2, ()), CheckedOut((), (), (), (), q.now + 30_000)),
        [],
    )
    assert list(q.machine.live_indexes()) == []


def test_strict_priorities_and_fifo_within_a_level() -> None:
    q = Q(priorities=3)
    q.publish(b"l0", priority=0)
    q.publish(b"l2a", priority=2)
    q.publish(b"l1", priority=1)
    q.publish(b"l2b", priority=7)  # clamped to the top level
    got = q.take()
    assert [d.priority for d in got] == [2, 2, 1, 0]
    assert q.bodies(got) == [2 * 1024, 4 * 1024, 3 * 1024, 1024]


def test_returned_messages_go_before_new_ones_of_their_level() -> None:
    q = Q(priorities=2)
    q.publish(b"a", b"b", b"c")
    first = q.take(2)
    q.publish(b"hi", priority=1)
    reply, effects = q.apply(encode_return(receipts(first[::-1])))
    assert (reply, effects) == (Settled(2, ()), [])
    got = q.take()
    assert [q.bodies([d])[0] for d in got] == [3 * 1024, 1025, 1024, 1026]
    assert [d.delivery_count for d in got] == [1, 2, 2, 1]


def test_an_expired_lease_returns_the_message_and_its_receipt_goes_stale() -> None:
    q = Q(lease_ms=1000)
    q.publish(b"a")
    [first] = q.take()
    q.now += 999
    assert q.apply(encode_expire())[0] == Expired(0, 0, 0)
    q.now += 1
    reply, effects = q.apply(encode_expire())
    assert reply == Expired(1, 0, 0)
    assert effects == [MessagesAvailable(1)]
    [second] = q.take()
    assert (second.tag, second.delivery_count) == (2, 2)
    assert q.apply(encode_settle(receipts([first, second, second])))[0] == Settled(1, (0, 2))


def test_extend_keeps_a_lease_alive() -> None:
    q = Q(lease_ms=1000)
    q.publish(b"a", b"b")
    got = q.take()
    q.now += 900
    assert q.apply(encode_extend(receipts(got[:1]), 5000))[0] == Settled(1, ())
    assert q.machine.next_deadline_ms() == 2000
    q.now += 100
    assert q.apply(encode_expire())[0] == Expired(1, 0, 0)
    assert q.machine.stats().messages_unacked == 1
    assert q.machine.next_deadline_ms() == 1000 + 900 + 5000


def test_delivery_limit_dead_letters_and_the_source_keeps_it_until_confirmed() -> None:
    q = Q(delivery_limit=2, dead_letter_queue="dlq")
    q.publish(b"a")
    for attempt in (1, 2):
        [d] = q.take()
        assert d.delivery_count == attempt
        _reply, effects = q.apply(encode_return(receipts([d])))
    assert effects == [DeadLetter("dlq", "delivery_limit", (d.ref,), (2,))]
    s = q.machine.stats()
    assert (s.messages_ready, s.messages_dead_lettering, s.dead_lettered) == (0, 1, 1)
    assert list(q.machine.live_indexes()) == [1]
    q.now += 10_000
    assert q.apply(encode_expire())[1] == [DeadLetter("dlq", "delivery_limit", (d.ref,), (2,))]
    assert q.apply(encode_dead_letter_confirm([d.ref, d.ref]))[0] == DeadLetterConfirmed(1)
    assert list(q.machine.live_indexes()) == []


def test_discard_dead_letters_as_rejected_or_drops_without_a_target() -> None:
    q = Q(dead_letter_queue="dlq")
    q.publish(b"a")
    [d] = q.take()
    assert q.apply(encode_discard(receipts([d])))[1] == [
        DeadLetter("dlq", "rejected", (d.ref,), (1,))
    ]
    q2 = Q()
    q2.publish(b"a")
    [d2] = q2.take()
    assert q2.apply(encode_discard(receipts([d2]))) == (Settled(1, ()), [])
    s = q2.machine.stats()
    assert (s.dropped, s.messages_dead_lettering, s.messages_unacked) == (1, 0, 0)


def test_message_ttl_expires_at_the_head_and_is_never_delivered() -> None:
    q = Q(dead_letter_queue="dlq")
    q.publish(b"short", ttl_ms=100)
    q.publish(b"long", ttl_ms=10_000)
    q.now += 100
    got = q.take()
    assert q.bodies(got) == [2048]
    assert q.machine.stats().expired == 1


def test_queue_ttl_is_never_early_and_at_most_the_resolution_late() -> None:
    q = Q(message_ttl_ms=300)  # enqueue times kept to 10 ms by default
    q.now = 10_000
    q.publish(b"a")  # opens an interval at 10000
    q.now = 10_007
    q.publish(b"b")  # same interval: a and b were both enqueued by 10007
    q.now = 10_010
    q.publish(b"c")  # opens the next interval: c's time is exact
    assert q.machine.next_deadline_ms() == 10_307
    q.now = 10_306
    assert q.apply(encode_expire())[0] == Expired(0, 0, 0)
    q.now = 10_307  # a 7 ms late, b on time
    assert q.apply(encode_expire())[0] == Expired(0, 2, 0)
    assert q.machine.next_deadline_ms() == 10_310
    q.now = 10_309
    assert q.apply(encode_expire())[0] == Expired(0, 0, 0)
    q.publish(b"d")
    q.now = 10_310  # a checkout at c's expiry time does not deliver c
    assert q.bodies(q.take()) == [message_id(7, 0)]
    assert q.machine.stats().expired == 3


def test_queue_ttl_of_one_message_per_interval_is_exact() -> None:
    q = Q(message_ttl_ms=500)
    for k in range(5):
        q.now = 20_000 + 37 * k
        q.publish(b"m")
    for k in range(5):
        due = 20_000 + 37 * k + 500
        assert q.machine.next_deadline_ms() == due
        q.now = due - 1
        assert q.apply(encode_expire())[0] == Expired(0, 0, 0)
        q.now = due
        assert q.apply(encode_expire())[0] == Expired(0, 1, 0)


def test_delayed_messages_wait_until_due() -> None:
    q = Q()
    q.publish(b"later", delay_ms=500)
    q.publish(b"now")
    assert q.bodies(q.take()) == [2048]
    assert q.machine.stats().messages_delayed == 1
    assert q.machine.next_deadline_ms() == 1500
    q.now += 500
    assert q.bodies(q.take()) == [1024]


def test_dedup_within_the_window() -> None:
    q = Q(Limits(dedup_window_ms=1000))
    assert q.publish(b"a", dedup_id=b"k") == Enqueued((1024,), (False,))
    reply, _ = q.apply(encode_enqueue([NewMessage(b"a", dedup_id=b"k"), NewMessage(b"b")]))
    assert reply == Enqueued((1024, 2049), (True, False))
    assert q.machine.stats().messages_ready == 2
    q.now += 1000
    assert q.publish(b"a", dedup_id=b"k") == Enqueued((3 * 1024,), (False,))


def test_reject_publish_is_all_or_nothing() -> None:
    q = Q(max_length=3)
    q.publish(b"a", b"b")
    reply = q.publish(b"c", b"d")
    assert isinstance(reply, Rejected) and reply.error is QueueFull
    assert q.machine.stats().messages_ready == 2
    assert q.publish(b"c") == Enqueued((3 * 1024,), (False,))


def test_max_bytes_with_drop_head_dead_letters_the_oldest() -> None:
    q = Q(max_bytes=10, overflow="drop-head", dead_letter_queue="dlq")
    q.publish(b"12345", b"12345")
    reply, effects = q.apply(encode_enqueue([NewMessage(b"abc")]))
    assert reply == Enqueued((2048,), (False,))
    [effect] = effects
    assert isinstance(effect, DeadLetter) and effect.reason == "maxlen"
    assert q.bodies(q.take()) == [1025, 2048]


def test_a_message_over_max_message_bytes_rejects_the_batch() -> None:
    q = Q(max_message_bytes=4)
    reply = q.publish(b"1234", b"12345")
    assert isinstance(reply, Rejected) and reply.error is MessageTooLarge
    assert q.machine.stats().published == 0


def test_purge_drops_ready_and_delayed_but_not_leased() -> None:
    q = Q()
    q.publish(b"a", b"b")
    q.publish(b"c", delay_ms=100)
    q.take(1)
    assert q.apply(encode_purge()) == (Purged(2), [])
    s = q.machine.stats()
    assert (s.messages_ready, s.messages_delayed, s.messages_unacked) == (0, 0, 1)


def test_policy_changes_are_validated() -> None:
    q = Q(priorities=2)
    reply, _ = q.apply(encode_policy({"overflow": "explode"}))
    assert isinstance(reply, Rejected) and reply.error is ValidationFailed
    reply, _ = q.apply(encode_policy({"priorities": 3}))
    assert isinstance(reply, Rejected) and reply.error is QueueConflict
    reply, _ = q.apply(encode_policy({"max_length": 5, "delivery_limit": None}))
    assert isinstance(reply, PolicyChanged)
    assert (q.machine.policy.max_length, q.machine.policy.delivery_limit) == (5, None)


def test_lowering_max_length_with_drop_head_trims_at_once() -> None:
    q = Q(priorities=2)
    q.publish(b"hi", priority=1)
    q.publish(b"a", b"b", b"c")
    reply, effects = q.apply(encode_policy({"max_length": 2, "overflow": "drop-head"}))
    assert isinstance(reply, PolicyChanged) and effects == []
    assert q.bodies(q.take()) == [1024, 2048 + 2]
    assert q.machine.stats().dropped == 2


def test_live_indexes_are_exact() -> None:
    q = Q()
    q.publish(b"a", b"b")  # 1
    q.publish(b"c")  # 2
    q.publish(b"d", delay_ms=10)  # 3
    got = q.take(2)
    q.apply(encode_settle(receipts(got[:1])))
    assert list(q.machine.live_indexes()) == [1, 2, 3]
    q.apply(encode_settle(receipts(got[1:])))
    assert list(q.machine.live_indexes()) == [2, 3]


def test_checkpoint_when_dead_bytes_reach_twice_the_estimate() -> None:
    q = Q(Limits(checkpoint_bytes_min=1000))
    q.publish(b"keep", delay_ms=10**9)  # index 1 stays live
    effects: list[Any] = []
    rounds = 0
    while not effects:
        rounds += 1
        q.publish(b"x" * 200)
        [d] = q.take(1)
        _, effects = q.apply(encode_settle(receipts([d])))
    # Dead per round: the checkout and settle commands, and the consumed message's record
    # and bytes. Threshold: 2 x max(1 message x 64 B, checkpoint_bytes_min = 1000).
    per_round = len(encode_checkout("c", 10, 0)) + len(encode_settle([(1, 1)])) + 32 + 200
    assert rounds == -(-2000 // per_round)
    assert effects == [CheckpointRequest(q.index), ReleaseCursor(1)]
    assert q.machine.stats().dead_bytes == 0


def test_browse_pages_through_ready_messages_in_delivery_order() -> None:
    q = Q(priorities=2)
    q.publish(b"a", b"b", b"c")
    q.publish(b"hi", priority=1)
    [d] = q.take(1)
    q.apply(encode_return(receipts([d])))
    whole = q.machine.browse(None, 100)
    assert [(i.priority, i.delivery_count) for i in whole] == [(1, 1), (0, 0), (0, 0), (0, 0)]
    assert q.bodies([Delivery(0, i.ref, 0, 0) for i in whole]) == [2048, 1024, 1025, 1026]
    first = q.machine.browse(None, 2)
    rest = q.machine.browse(first[-1].cursor, 100)
    assert [i.ref for i in first + rest] == [i.ref for i in whole]
    assert q.machine.stats().messages_ready == 4


@pytest.mark.parametrize("count", [1, 17, 1000])
def test_restore_gives_back_the_same_machine(count: int) -> None:
    limits = Limits(page_refs=16)
    q = Q(limits, priorities=2, message_ttl_ms=10_000)
    q.publish(*[bytes([k % 256]) * (k % 50) for k in range(count)])
    q.publish(b"big" * 20_000)
    got = q.take(count // 2 + 1)
    q.apply(encode_extend(receipts(got[:1]), 99))
    data = q.machine.snapshot()
    other = QueueMachine(limits=limits)
    other.restore(data)
    other.check_invariants()
    assert other.snapshot() == data
    assert replace(other.stats(), memory_bytes=0, memory=NO_MEMORY) == replace(
        q.machine.stats(), memory_bytes=0, memory=NO_MEMORY
    )


def test_extending_twice_to_the_same_time_expires_once() -> None:
    q = Q(lease_ms=1000)
    q.publish(b"a")
    got = q.take()
    q.apply(encode_extend(receipts(got), 500))
    q.apply(encode_extend(receipts(got), 500))
    q.now += 500
    assert q.apply(encode_expire())[0] == Expired(1, 0, 0)
    q.machine.check_invariants()


def test_clearing_the_dead_letter_target_drops_what_is_waiting_for_it() -> None:
    q = Q(dead_letter_queue="dlq")
    q.publish(b"a")
    [d] = q.take()
    q.apply(encode_discard(receipts([d])))
    assert q.machine.stats().messages_dead_lettering == 1
    reply, effects = q.apply(encode_policy({"dead_letter_queue": None}))
    assert isinstance(reply, PolicyChanged) and effects == []
    s = q.machine.stats()
    assert (s.messages_dead_lettering, s.dropped) == (0, 1)
    assert list(q.machine.live_indexes()) == []


def test_next_deadline_names_the_earliest_timer() -> None:
    q = Q(message_ttl_ms=10_000, lease_ms=3_000)
    assert q.machine.next_deadline_ms() is None
    q.publish(b"a")  # the head expires at exactly 1000 + 10000
    assert q.machine.next_deadline_ms() == 11_000
    q.publish(b"b", delay_ms=5_000)
    assert q.machine.next_deadline_ms() == 6_000
    q.take()
    assert q.machine.next_deadline_ms() == 4_000


def test_browse_shows_neither_leased_nor_delayed_messages() -> None:
    q = Q()
    q.publish(b"a", b"b")
    q.publish(b"c", delay_ms=100)
    q.take(1)
    assert q.bodies([Delivery(0, i.ref, 0, 0) for i in q.machine.browse()]) == [1025]


def test_max_length_counts_delayed_messages() -> None:
    q = Q(max_length=1)
    q.publish(b"a", delay_ms=100)
    reply = q.publish(b"b")
    assert isinstance(reply, Rejected) and reply.error is QueueFull


def test_memory_is_broken_down_by_what_holds_it() -> None:
    q = Q(Limits(page_refs=16), message_ttl_ms=60_000)
    empty = q.machine.stats().memory
    assert empty.index_bytes == empty.leases_bytes == empty.extras_bytes == 0
    assert empty.fixed_bytes > 0
    for _ in range(40):
        q.now += 10
        q.publish(b"m", b"m")
    q.take(5)
    q.publish(b"late", ttl_ms=5)
    s = q.machine.stats()
    m = s.memory
    assert (
        s.memory_bytes
        == m.total_bytes
        == (m.index_bytes + m.enqueue_times_bytes + m.leases_bytes + m.extras_bytes + m.fixed_bytes)
    )
    assert m.fixed_bytes == empty.fixed_bytes
    assert m.index_bytes >= 8 * 76 and m.leases_bytes >= 8 * 5
    assert m.enqueue_times_bytes >= 8 * 41 and m.extras_bytes >= 1


IDLE_QUEUE_BYTES_MAX = 2100
"""An idle queue's engine memory (the machine, default limits): it was 33 KB while a
whole page of refs was allocated for its first message, 3.9 KB while its pages were a
deque (760 bytes for one page) and it held two empty arrays of enqueue times; 2.9 KB
while it kept its counters in a dict, its lanes in four tuples and empty lease tables
and per-ref dicts of its own; 2.0 KB with its own empty dedup, dead-letter, delayed and
fallback tables; 1.8 KB since."""


@pytest.mark.parametrize(("messages", "settled"), [(2, 0), (10, 0), (10, 3)])
def test_an_idle_queue_is_small_and_its_memory_bytes_says_so(messages: int, settled: int) -> None:
    """What tracemalloc sees a machine holding a few messages keep stays under the bound,
    and ``memory_bytes`` estimates it within a third either way; a queue whose leases were
    all settled (``settled`` messages received and acked) is as small as one never read."""
    queues = 100
    limits = Limits()
    Q(limits).publish(b"warm")  # first uses (caches of modules) are not a queue's
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        held = [Q(limits) for _ in range(queues)]
        for q in held:
            for _ in range(messages):
                q.publish(b"m" * 64)
            if settled:
                q.apply(encode_settle(receipts(q.take(settled))))
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    measured = sum(s.size_diff for s in after.compare_to(before, "filename"))
    per_queue = measured / queues
    estimate = held[0].machine.stats().memory_bytes
    assert per_queue <= IDLE_QUEUE_BYTES_MAX, per_queue
    assert estimate <= IDLE_QUEUE_BYTES_MAX, estimate
    assert per_queue * 2 / 3 <= estimate <= per_queue * 4 / 3, (estimate, per_queue)


def test_a_queue_ttl_set_later_counts_from_the_change_and_none_keeps_no_times() -> None:
    q = Q()
    empty = q.machine.stats().memory.enqueue_times_bytes
    for _ in range(30):
        q.now += 20
        q.publish(b"m")
    assert q.machine.stats().memory.enqueue_times_bytes == empty  # no queue TTL: no samples
    q.now = 5_000
    assert isinstance(q.apply(encode_policy({"message_ttl_ms": 100}))[0], PolicyChanged)
    q.now = 5_050
    q.publish(b"new")
    assert q.machine.next_deadline_ms() == 5_100  # the older ones count from 5000
    q.now = 5_099
    assert q.apply(encode_expire())[0] == Expired(0, 0, 0)
    q.now = 5_100
    assert q.apply(encode_expire())[0] == Expired(0, 30, 0)
    assert q.machine.next_deadline_ms() == 5_150
    q.apply(encode_policy({"message_ttl_ms": None}))
    assert q.machine.stats().memory.enqueue_times_bytes == empty
