"""Frames: one dedup id for a run of messages of a publish batch (``FLAG_FRAME`` in
``engine.queue.enqueue_codec``). A frame whose id the window holds is a duplicate whole,
on the fast and the general paths alike, after a snapshot too; frame ids and message ids
never match each other; a frame that does not fit its entry is refused."""

from __future__ import annotations

import struct

import msgpack

from engine.errors import InvalidRequest
from engine.limits import Limits
from engine.queue import Enqueued, NewMessage, QueueMachine, QueuePolicy, Rejected, encode_enqueue
from engine.queue import enqueue_codec as codec
from engine.queue.snapshots import SnapshotState
from engine.raft.state_machine import ApplyMeta
from tests.engine.queue.test_fast_paths import Twin


def frame(frame_id: bytes, count: int, tag: str = "m") -> list[NewMessage | bytes]:
    bodies = [f"{tag}{k}".encode() for k in range(count)]
    return [NewMessage(bodies[0], dedup_id=frame_id, frame_count=count), *bodies[1:]]


def test_a_resent_frame_is_a_duplicate_whole_with_the_first_frames_ids() -> None:
    for count in (1, 5, codec.ENQUEUE_FEW_MAX + 1, 300):
        t = Twin()
        first = t.apply(encode_enqueue(frame(b"f", count)))
        assert isinstance(first, Enqueued) and not any(first.duplicate)
        again = t.apply(encode_enqueue(frame(b"f", count)))
        assert again == Enqueued(first.ids, (True,) * count)
        assert t.fast.stats().messages_ready == count
        assert t.fast.stats().duplicates == count


def test_frames_in_one_entry_next_to_keyed_and_plain_messages() -> None:
    t = Twin(Limits(dedup_window_ms=1000))
    t.apply(encode_enqueue(frame(b"a", 3)))
    # a repeat of "a", a new frame "b" twice in one entry, a message whose own id is
    # "a" (another namespace: not a duplicate) and a plain message
    batch = [
        *frame(b"a", 3, "x"),
        *frame(b"b", 20),
        *frame(b"b", 20),
        NewMessage(b"own", dedup_id=b"a"),
        b"plain",
    ]
    reply = t.apply(encode_enqueue(batch))
    assert isinstance(reply, Enqueued)
    assert reply.duplicate == (True,) * 3 + (False,) * 20 + (True,) * 20 + (False, False)
    assert reply.ids[:3] == tuple(range(1024, 1027))
    assert reply.ids[23:43] == reply.ids[3:23]
    assert t.fast.stats().messages_ready == 3 + 20 + 2
    t.now += 1000  # the window passed: "a" is new again
    assert t.apply(encode_enqueue(frame(b"a", 2))) == Enqueued((3072, 3073), (False, False))


def test_a_frame_id_outlives_a_snapshot_and_an_old_snapshot_loads() -> None:
    limits = Limits()
    m = QueueMachine(QueuePolicy(), limits)
    m.apply(ApplyMeta(1, 1, 1_000), encode_enqueue([NewMessage(b"k", dedup_id=b"k")]))
    old_form = m.snapshot()  # no frame id yet: the dedup window's form as before
    state = msgpack.unpackb(old_form, raw=False, strict_map_key=False)
    assert state[SnapshotState._fields.index("dedup")][0] == 2
    first, _ = m.apply(ApplyMeta(2, 1, 1_001), encode_enqueue(frame(b"f", 40)))
    restored = QueueMachine(QueuePolicy(), limits)
    restored.restore(m.snapshot())
    restored.check_invariants()
    assert restored.snapshot() == m.snapshot()
    again, _ = restored.apply(ApplyMeta(3, 1, 1_002), encode_enqueue(frame(b"f", 40)))
    assert isinstance(first, Enqueued) and again == Enqueued(first.ids, (True,) * 40)
    older = QueueMachine(QueuePolicy(), limits)
    older.restore(old_form)
    reply, _ = older.apply(
        ApplyMeta(2, 1, 1_001), encode_enqueue([NewMessage(b"k", dedup_id=b"k")])
    )
    assert reply == Enqueued((1024,), (True,))


def test_framed_bodies_encode_as_the_general_path_does() -> None:
    batch = [*frame(b"a", 10), b"lone", *frame(b"bb", 30)]
    general = [m if type(m) is NewMessage else NewMessage(m) for m in batch]
    encoded = encode_enqueue(batch)
    assert encoded == encode_enqueue(general)
    assert len(encoded) == codec.enqueue_bytes(batch)
    head = codec.read_message(encoded, 11)
    assert head.dedup_id == b"bb" and bytes(head.body) == b"m0"
    assert codec.message_run(encoded, 0, 3)[0] == [b"m0", b"m1", b"m2"]


def _with_record(entry: bytes, slot: int, **fields: int) -> bytes:
    names = ("body_len", "headers_len", "data_offset", "dedup_len", "priority", "flags")
    at = 4 + slot * codec.RECORD_BYTES
    record = list(struct.unpack_from("<IIIHBBqq", entry, at))
    for name, value in fields.items():
        record[names.index(name)] = value
    out = bytearray(entry)
    struct.pack_into("<IIIHBBqq", out, at, *record)
    return bytes(out)


def test_a_frame_that_does_not_fit_its_entry_is_refused() -> None:
    short = encode_enqueue(frame(b"f", 3))
    past_end = bytearray(short)
    struct.pack_into("<H", past_end, 4 + 3 * codec.RECORD_BYTES, 4)  # the count: 4 of 3
    over_keyed = encode_enqueue([*frame(b"f", 2), NewMessage(b"k", dedup_id=b"k")])
    over_keyed = bytearray(over_keyed)
    struct.pack_into("<H", over_keyed, 4 + 3 * codec.RECORD_BYTES, 3)
    long = encode_enqueue(frame(b"g", 40))
    other_flag = _with_record(long, 0, flags=codec.FLAG_FRAME | 2)
    flagged_inside = _with_record(long, 5, flags=codec.FLAG_FRAME)
    no_id = _with_record(short, 0, dedup_len=2)
    for command in (bytes(past_end), bytes(over_keyed), other_flag, flagged_inside, no_id):
        t = Twin()
        reply = t.apply(command)
        assert isinstance(reply, Rejected) and reply.error is InvalidRequest, reply
        assert t.fast.stats().messages_ready == 0
