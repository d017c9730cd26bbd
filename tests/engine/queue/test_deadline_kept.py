"""The machine's next deadline, asked after every command as the runtime asks it, is
the one computed afresh: the publishes that leave it as it was (no TTL, no delay, room
in the queue) keep it, every other command gives the new one."""

from __future__ import annotations

from engine.limits import Limits
from engine.queue import NewMessage, encode_enqueue
from tests.engine.queue.test_machine import Q


def test_a_plain_publish_keeps_the_deadline_of_an_earlier_timer() -> None:
    q = Q()
    q.publish(b"a", delay_ms=500)
    assert q.machine.next_deadline_ms() == 1_500
    q.publish(b"b")
    assert q.machine.next_deadline_ms() == 1_500
    q.now = 2_000
    q.take()  # releases the delayed one (its time passed) and leases both
    assert q.machine.next_deadline_ms() == 2_000 + Limits().lease_ms_default


def test_a_publish_with_a_ttl_gives_a_deadline() -> None:
    q = Q()
    assert q.machine.next_deadline_ms() is None
    q.publish(b"a", ttl_ms=300)  # the head of the lane
    assert q.machine.next_deadline_ms() == 1_300


def test_a_publish_with_a_delay_gives_a_deadline() -> None:
    q = Q()
    assert q.machine.next_deadline_ms() is None
    q.publish(b"a")
    assert q.machine.next_deadline_ms() is None
    q.publish(b"b", delay_ms=250)
    assert q.machine.next_deadline_ms() == 1_250


def test_a_large_batch_with_a_ttl_gives_a_deadline() -> None:
    """More messages than a batch read one by one: the batch is read as arrays."""
    q = Q()
    assert q.machine.next_deadline_ms() is None
    q.publish(*(b"x" for _ in range(40)), ttl_ms=700)
    assert q.machine.next_deadline_ms() == 1_700


def test_a_publish_to_a_queue_with_a_ttl_gives_the_head_s_expiry() -> None:
    q = Q(message_ttl_ms=1_000)
    assert q.machine.next_deadline_ms() is None
    q.publish(b"a")
    assert q.machine.next_deadline_ms() == 2_000


def test_a_publish_that_drops_the_head_gives_its_dead_letter_s_retry() -> None:
    limits = Limits()
    q = Q(limits, max_length=1, overflow="drop-head", dead_letter_queue="dlq")
    q.publish(b"a")
    assert q.machine.next_deadline_ms() is None
    _, effects = q.apply(encode_enqueue([NewMessage(b"b")]))
    assert effects, "the head was dead-lettered"
    assert q.machine.next_deadline_ms() == 1_000 + limits.dead_letter_retry_ms
