"""The command codec: what the runtime encodes is what the machine and the reader decode."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import InvalidRequest
from engine.queue import (
    KeyedBody,
    Kind,
    NewMessage,
    QueueMachine,
    Rejected,
    command_kind,
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
    enqueue_count,
    message_run,
    read_message,
)
from engine.queue.commands import (
    decode_checkout,
    decode_dead_letter_confirm,
    decode_policy,
    decode_receipts,
    split_settle_checkout,
)
from engine.queue.enqueue_codec import dedup_id_at, enqueue_records
from engine.raft.state_machine import ApplyMeta

new_messages = st.builds(
    NewMessage,
    body=st.binary(max_size=300),
    headers=st.binary(max_size=40),
    priority=st.integers(0, 255),
    ttl_ms=st.one_of(st.none(), st.integers(0, 1 << 40)),
    delay_ms=st.integers(0, 1 << 40),
    dedup_id=st.one_of(st.none(), st.binary(min_size=1, max_size=255)),
)


@settings(max_examples=80, deadline=None)
@given(st.lists(new_messages, min_size=1, max_size=40))
def test_enqueue_entry_round_trip(messages: list[NewMessage]) -> None:
    entry = encode_enqueue(messages)
    assert command_kind(entry) is Kind.ENQUEUE
    assert enqueue_count(entry) == len(messages)
    recs = enqueue_records(entry)
    for k, m in enumerate(messages):
        view = read_message(entry, k)
        assert bytes(view.body) == m.body and bytes(view.headers) == m.headers
        assert (view.priority, view.ttl_ms, view.delay_ms, view.dedup_id) == (
            m.priority,
            m.ttl_ms,
            m.delay_ms,
            m.dedup_id,
        )
        assert int(recs["body_len"][k]) + int(recs["headers_len"][k]) == len(m.body) + len(
            m.headers
        )
    for first in range(len(messages)):
        for count in range(1, len(messages) - first + 1):
            wanted = messages[first : first + count]
            bodies, headers = message_run(entry, first, count)
            assert bodies == [m.body for m in wanted]
            if headers is None:
                assert not any(m.headers for m in wanted)
            else:
                assert headers == [m.headers for m in wanted]


keyed_bodies = st.tuples(st.binary(min_size=1, max_size=255), st.binary(max_size=300))


def _spelled(m: NewMessage | bytes | KeyedBody) -> NewMessage:
    if isinstance(m, bytes):
        return NewMessage(m)
    if isinstance(m, tuple):
        return NewMessage(m[1], dedup_id=m[0])
    return m


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.one_of(new_messages, st.binary(max_size=300), keyed_bodies), min_size=1, max_size=40
    )
)
def test_a_body_alone_encodes_as_a_message_with_defaults(
    messages: list[NewMessage | bytes | KeyedBody],
) -> None:
    """A bare ``bytes`` in a batch is the same entry as ``NewMessage(body)`` there, and a
    (dedup id, body) pair the same as ``NewMessage(body, dedup_id=...)``."""
    assert encode_enqueue(messages) == encode_enqueue([_spelled(m) for m in messages])


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 1024).flatmap(
        lambda n: st.lists(
            st.tuples(st.binary(min_size=1, max_size=40), st.binary(max_size=64)),
            min_size=n,
            max_size=n,
        )
    )
)
def test_a_batch_of_keyed_bodies_is_the_entry_of_its_messages(messages: list[KeyedBody]) -> None:
    """Past ``ENQUEUE_FEW_MAX``, (dedup id, body) pairs are encoded by array operations:
    byte for byte the entry of the same ``NewMessage``s, each id read back."""
    entry = encode_enqueue(messages)
    assert entry == encode_enqueue([_spelled(m) for m in messages])
    records = enqueue_records(entry)
    assert [dedup_id_at(entry, r) for r in records] == [d for d, _b in messages]


@settings(max_examples=60, deadline=None)
@given(
    st.one_of(
        st.lists(st.binary(max_size=300), min_size=1, max_size=40),
        st.integers(1, 1024).flatmap(
            lambda n: st.lists(st.binary(max_size=64), min_size=n, max_size=n)
        ),
    )
)
def test_a_batch_of_bodies_alone_is_the_entry_of_its_messages(bodies: list[bytes]) -> None:
    """A batch of bare bodies, past ``ENQUEUE_FEW_MAX`` encoded by array operations in
    one pass, is byte for byte the entry of the same ``NewMessage``s, record by record."""
    entry = encode_enqueue(bodies)
    assert entry == encode_enqueue([NewMessage(b) for b in bodies])
    assert message_run(entry, 0, len(bodies)) == (bodies, None)


def test_the_record_table_is_read_in_place() -> None:
    entry = encode_enqueue([NewMessage(b"x" * 1000) for _ in range(3)])
    recs = enqueue_records(entry)
    assert not recs.flags.owndata
    assert np.shares_memory(recs, np.frombuffer(entry, dtype=np.uint8))
    assert isinstance(read_message(entry, 2).body.obj, bytes)


def test_receipt_commands_round_trip() -> None:
    receipts = [(1, 2), ((1 << 64) - 1, 5), (7, (1 << 64) - 1)]
    for encode in (encode_settle, encode_return, encode_discard):
        tags, refs, lease = decode_receipts(encode(receipts))
        assert list(zip(tags.tolist(), refs.tolist(), strict=True)) == receipts and lease == 0
    tags, refs, lease = decode_receipts(encode_extend(receipts, 1234))
    assert list(zip(tags.tolist(), refs.tolist(), strict=True)) == receipts and lease == 1234


def test_other_commands_round_trip() -> None:
    c = decode_checkout(encode_checkout("consumer-é", 1000, 5000))
    assert (c.consumer, c.max_messages, c.lease_ms) == ("consumer-é", 1000, 5000)
    assert decode_dead_letter_confirm(encode_dead_letter_confirm([3, 1 << 63])).tolist() == [
        3,
        1 << 63,
    ]
    assert decode_policy(encode_policy({"overflow": "drop-head", "max_length": None})) == {
        "max_length": None,
        "overflow": "drop-head",
    }
    assert command_kind(encode_purge()) is Kind.PURGE
    assert command_kind(encode_expire()) is Kind.EXPIRE


def test_settle_checkout_holds_a_settle_and_a_checkout_whole() -> None:
    receipts = [(1, 2), ((1 << 64) - 1, 5)]
    entry = encode_settle_checkout(receipts, "consumer-é", 100, 5000)
    assert command_kind(entry) is Kind.SETTLE_CHECKOUT
    settle, checkout = split_settle_checkout(entry)
    assert settle == encode_settle(receipts)
    assert checkout == encode_checkout("consumer-é", 100, 5000)
    assert split_settle_checkout(encode_settle_checkout([], "c", 1)) == (
        encode_settle([]),
        encode_checkout("c", 1),
    )


def _settle_checkout(settle: bytes, checkout: bytes, settle_len: int | None = None) -> bytes:
    n = len(settle) if settle_len is None else settle_len
    return b"A\x01" + n.to_bytes(4, "little") + settle + checkout


MALFORMED_SETTLE_CHECKOUTS: dict[str, Callable[[bytes, bytes], bytes]] = {
    "head only": lambda s, c: b"A\x01",
    "short head": lambda s, c: b"A\x01\x00\x00",
    "no checkout": lambda s, c: _settle_checkout(s, b""),
    "short checkout": lambda s, c: _settle_checkout(s, c[:-1]),
    "settle length too long": lambda s, c: _settle_checkout(s, c, len(s) + 3),
    "settle length too short": lambda s, c: _settle_checkout(s, c, len(s) - 1),
    "short settle": lambda s, c: _settle_checkout(s[:-1], c),
    "a return, not a settle": lambda s, c: _settle_checkout(b"R" + s[1:], c),
    "a settle, not a checkout": lambda s, c: _settle_checkout(s, b"S" + c[1:]),
    "settle of another version": lambda s, c: _settle_checkout(s[:1] + b"\x02" + s[2:], c),
    "checkout inside the settle": lambda s, c: _settle_checkout(s + c, b""),
    "settle count beyond its bytes": lambda s, c: _settle_checkout(s[:2] + b"\x02" + s[3:], c),
}


@pytest.mark.parametrize(
    "build", MALFORMED_SETTLE_CHECKOUTS.values(), ids=MALFORMED_SETTLE_CHECKOUTS
)
def test_a_malformed_settle_checkout_settles_nothing(
    build: Callable[[bytes, bytes], bytes],
) -> None:
    """The settle part names a live lease: nothing of it may be applied when the entry
    as a whole does not parse."""
    machine = QueueMachine()
    machine.apply(ApplyMeta(1, 1, 10), encode_enqueue([NewMessage(b"a"), NewMessage(b"b")]))
    machine.apply(ApplyMeta(2, 1, 10), encode_checkout("c", 1))
    leased = machine.pending_items()
    before = machine.stats()
    garbage = build(encode_settle(leased), encode_checkout("c", 5))
    reply, effects = machine.apply(ApplyMeta(3, 1, 10), garbage)
    assert isinstance(reply, Rejected) and reply.error is InvalidRequest, reply
    assert effects == []
    after = machine.stats()
    assert (after.messages_unacked, after.messages_ready, after.acked, after.delivered) == (
        before.messages_unacked,
        before.messages_ready,
        before.acked,
        before.delivered,
    )
    assert machine.pending_items() == leased


@pytest.mark.parametrize(
    "garbage",
    [
        b"",
        b"E",
        b"Z\x01",
        b"E\x02\x01\x00",
        b"E\x01\xff\xff",
        b"S\x01\x05\x00\x00\x00\x00\x00",
        b"O\x01\xc1",
        b"C\x01",
        b"X\x01\x01",
        b"K\x01\x02\x00\x00\x00\x00\x00\x01",
    ],
)
def test_malformed_commands_are_rejected_without_effect(garbage: bytes) -> None:
    machine = QueueMachine()
    before = machine.stats()
    reply, effects = machine.apply(ApplyMeta(1, 1, 10), garbage)
    assert isinstance(reply, Rejected) and reply.error is InvalidRequest
    assert effects == []
    after = machine.stats()
    assert after.messages_ready == before.messages_ready == 0
