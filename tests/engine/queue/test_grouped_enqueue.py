"""Publishes proposed as one entry (engine/runtime/publish_groups.py) against the same
publishes proposed one entry each.

The runtime merges the batches of one turn into one enqueue command, in the order they
came, when the queue's policy allows (``groupable``), and when the machine rejects that
entry it proposes each batch again on its own. Whatever the queue's limits, overflow,
dedup ids and priorities, both ways must give
each caller the same answer (the message each of its ids names, which of them are
duplicates, or the same rejection) and the queue the same deliveries in the same order,
the same dead letters and the same counts.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.limits import Limits
from engine.queue import (
    CheckedOut,
    DeadLetter,
    Enqueued,
    NewMessage,
    QueueMachine,
    QueuePolicy,
    Rejected,
    encode_checkout,
    encode_enqueue,
    encode_policy,
    enqueue_bytes,
    message_id_parts,
)
from engine.queue.enqueue_codec import DEDUP_ID_BYTES_MAX
from engine.raft.state_machine import ApplyMeta
from engine.runtime.publish_groups import groupable

Message = tuple[int, bytes | None, int]
"""(body size, dedup id, priority)."""

POLICIES: list[dict[str, Any]] = [
    {},
    {"priorities": 3},
    {"max_length": 6, "overflow": "reject-publish"},
    {"max_length": 6, "overflow": "drop-head", "dead_letter_queue": "dlq"},
    {"max_bytes": 150, "overflow": "reject-publish"},
    {"max_bytes": 150, "overflow": "drop-head", "dead_letter_queue": "dlq", "priorities": 2},
]

messages = st.tuples(
    st.integers(0, 40), st.one_of(st.none(), st.sampled_from([b"a", b"b", b"c"])), st.integers(0, 2)
)
parts = st.lists(messages, min_size=1, max_size=4)
turns = st.lists(
    st.tuples(st.lists(parts, min_size=1, max_size=5), st.integers(0, 4), st.booleans()),
    min_size=1,
    max_size=8,
)


class Run:
    def __init__(self, policy: dict[str, Any]) -> None:
        self.machine = QueueMachine(QueuePolicy(**policy), Limits(dedup_window_ms=10_000))
        self.index = 0
        self.now = 1_000
        self.bodies: dict[tuple[int, int], bytes] = {}
        self.dead: list[bytes] = []

    def apply(self, command: bytes) -> object:
        self.index += 1
        reply, effects = self.machine.apply(ApplyMeta(self.index, 1, self.now), command)
        self.machine.check_invariants()
        for effect in effects:
            if isinstance(effect, DeadLetter):
                self.dead += [self.body_of_ref(ref) for ref in effect.refs]
        return reply

    def body_of_ref(self, ref: int) -> bytes:
        parts = self.machine.ref_parts(ref)
        return self.bodies[parts.index, parts.slot]

    def publish(self, batch: list[NewMessage]) -> object:
        """Apply one enqueue entry; its bodies are known by (index, slot) from here on."""
        for slot, m in enumerate(batch):  # before: its own apply may drop some of them
            self.bodies[self.index + 1, slot] = m.body
        return self.apply(encode_enqueue(batch))

    def answer(self, reply: object, start: int, count: int) -> object:
        """What a caller learns: the body its id names and whether it is a duplicate."""
        if isinstance(reply, Rejected):
            return (reply.error, reply.detail)
        assert isinstance(reply, Enqueued)
        return [
            (self.bodies[message_id_parts(reply.ids[k])], reply.duplicate[k])
            for k in range(start, start + count)
        ]

    def take(self, n: int) -> list[bytes]:
        reply = self.apply(encode_checkout("c", n, 60_000))
        assert isinstance(reply, CheckedOut)
        return [self.body_of_ref(ref) for ref in reply.refs]


def run(policy: dict[str, Any], script: list[Any], grouped: bool) -> tuple[object, ...]:
    r = Run(policy)
    answers: list[object] = []
    delivered: list[bytes] = []
    counter = 0
    for turn, take, shrink in script:
        batches = []
        for part in turn:
            batch = []
            for size, dedup, priority in part:
                counter += 1
                body = b"%05d" % counter + b"x" * size
                batch.append(NewMessage(body, priority=priority, dedup_id=dedup))
            batches.append(batch)
        merged = [m for batch in batches for m in batch]
        reply = r.publish(merged) if grouped and len(batches) > 1 else None
        if isinstance(reply, Enqueued):
            start = 0
            for batch in batches:
                answers.append(r.answer(reply, start, len(batch)))
                start += len(batch)
        else:  # not grouped, or the group was rejected: each batch on its own
            for batch in batches:
                answers.append(r.answer(r.publish(batch), 0, len(batch)))
        if take:
            delivered += r.take(take)
        if shrink:  # a lower max_message_bytes: a group of larger messages is rejected
            r.apply(encode_policy({"max_message_bytes": 30 if counter % 2 else 1 << 20}))
        r.now += 1_000
    delivered += r.take(1000)
    s = r.machine.stats()
    counts = (s.messages_ready, s.bytes_ready, s.published, s.duplicates, s.dropped)
    return answers, delivered, r.dead, counts


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(POLICIES), turns)
def test_grouped_publishes_answer_and_deliver_as_one_entry_each(
    policy: dict[str, Any], script: list[Any]
) -> None:
    grouped = groupable(QueuePolicy(**policy))
    assert run(policy, script, grouped) == run(policy, script, grouped=False)


def test_a_group_over_the_queue_limit_is_answered_part_by_part() -> None:
    """One group, where alone the first batch fits and the second does not."""
    script = [([[(5, None, 0)] * 4, [(5, None, 0)] * 4], 0, False)]
    policy = {"max_length": 6, "overflow": "reject-publish"}
    answers = run(policy, script, grouped=True)[0]
    assert isinstance(answers, list) and isinstance(answers[0], list)
    assert answers[1][0] is not None and not isinstance(answers[1], list)
    assert answers == run(policy, script, grouped=False)[0]


def test_drop_head_with_a_limit_is_not_grouped() -> None:
    """Under drop-head, one entry of two batches drops the second batch's message of
    the lowest priority, where the first batch's entry alone dropped its own oldest."""
    policy = {"max_bytes": 150, "overflow": "drop-head", "priorities": 2}
    script = [
        ([[(11, None, 1), (40, None, 1), (40, None, 1), (40, None, 1)], [(0, None, 0)]], 0, False)
    ]
    assert run(policy, script, grouped=True) != run(policy, script, grouped=False)
    assert not groupable(QueuePolicy(**policy))
    assert groupable(QueuePolicy(max_bytes=150)) and groupable(QueuePolicy(overflow="drop-head"))


_items = st.one_of(
    st.binary(max_size=40),
    st.tuples(st.binary(min_size=1, max_size=DEDUP_ID_BYTES_MAX), st.binary(max_size=40)),
    st.builds(
        NewMessage,
        st.binary(max_size=40),
        headers=st.binary(max_size=20),
        priority=st.integers(0, 255),
        ttl_ms=st.none() | st.integers(0, 10**6),
        delay_ms=st.integers(0, 10**6),
        dedup_id=st.none() | st.binary(min_size=1, max_size=DEDUP_ID_BYTES_MAX),
    ),
)


@given(st.lists(_items, min_size=1, max_size=12))
def test_enqueue_bytes_is_the_encoded_length(batch: list[Any]) -> None:
    # A group's parts are sized by it before they join, against the limits a lone
    # publish is held to by its encoded entry.
    assert enqueue_bytes(batch) == len(encode_enqueue(batch))
