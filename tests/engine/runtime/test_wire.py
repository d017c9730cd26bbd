"""Everything a transport carries survives encode/decode as an equal value."""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import Backpressure, NoLeader, QueueNotFound, WireError
from engine.ids import ServerId
from engine.limits import DEFAULT_LIMITS
from engine.raft.entry import Entry, EntryKind
from engine.raft.messages import (
    INT_MAX,
    AppendRequest,
    AppendResponse,
    Heartbeat,
    HeartbeatResponse,
    SnapshotChunk,
    SnapshotResponse,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)
from engine.runtime import wire
from engine.runtime.api import (
    BrowsedMessage,
    CheckpointRecord,
    CompactionRecord,
    OutgoingMessage,
    QueueArgs,
    QueueHistory,
    QueueInfo,
    ReceivedBatch,
    ReceivedMessage,
    SegmentInfo,
    SettleResult,
)
from engine.runtime.meta import QueueMeta
from engine.runtime.routing import Joined, PurgeCall, StatsCall
from tests.engine.runtime.test_routing import CALLS, META_ANSWERS

A, B = ServerId("n1/q"), ServerId("n2/q")
REFUSAL = AppendResponse(
    src=A,
    dst=B,
    term=3,
    success=False,
    match_index=0,
    rejected_prev_index=9,
    conflict_term=2,
    conflict_index=5,
)
CHUNK = SnapshotChunk(
    src=A, dst=B, term=3, snapshot_index=100, snapshot_term=2, offset=0, data=b"chunk", done=False
)
VALUES: list[object] = [
    VoteRequest(src=A, dst=B, term=3, last_index=10, last_term=2, pre=True, transfer=False),
    VoteResponse(src=A, dst=B, term=3, granted=True, pre=False),
    AppendRequest(
        src=A,
        dst=B,
        term=3,
        prev_index=9,
        prev_term=2,
        entries=[
            Entry(10, 3, EntryKind.COMMAND, 1234, b"\x00data"),
            Entry(11, 3, EntryKind.NOOP, 1235, b""),
        ],
        commit=9,
    ),
    REFUSAL,
    Heartbeat(src=A, dst=B, term=3, commit=9, read_seq=4),
    HeartbeatResponse(src=A, dst=B, term=3, read_seq=4),
    CHUNK,
    SnapshotResponse(src=A, dst=B, term=3, snapshot_index=100, next_offset=-1),
    # The live entries after the checkpoint's bytes.
    dataclasses.replace(
        CHUNK, offset=40, data=b"", done=True, entries=[Entry(7, 1, EntryKind.COMMAND, 5, b"p")]
    ),
    SnapshotResponse(
        src=A, dst=B, term=3, snapshot_index=100, next_offset=40, missing=b"\x01missing"
    ),
    TimeoutNow(src=A, dst=B, term=3),
    QueueMeta("q", "uid", QueueArgs(replicas=3, dead_letter_queue="d"), 5, ("n1", "n2")),
    QueueInfo("q", "uid", QueueArgs(), 7),
    [OutgoingMessage(b"b", {"k": "v"}, 2, 100, 5, "id")],
    [ReceivedMessage(1, "r" * 32, b"x", {}, 0, 1, 2, 3)],
    [BrowsedMessage(1, 2, b"x", {"a": "b"}, 1, 0, 5)],
    SettleResult(2, (1,)),
    ReceivedBatch(
        SettleResult(1, (0,)),
        [1, 2],
        ["r" * 64] * 2,
        [b"x", b""],
        [{}, {"k": "v"}],
        [0, 9],
        [1, 2],
        [5, 6],
        7,
    ),
    ["publish", "q", None, 1, {"max_length": 3}],
]


@pytest.mark.parametrize("value", VALUES, ids=lambda v: type(v).__name__)
def test_round_trip(value: object) -> None:
    back = wire.decode(wire.encode(value))
    assert back == value
    if isinstance(value, AppendRequest | SnapshotChunk):
        assert all(type(e.kind) is EntryKind for e in back.entries)


def test_errors_keep_their_class_and_detail() -> None:
    for error in (NoLeader("no leader"), Backpressure("slow down"), QueueNotFound("q")):
        back = wire.decode(wire.encode(error))
        assert type(back) is type(error) and back.detail == error.detail


def test_only_registered_types_encode() -> None:
    with pytest.raises(TypeError):
        wire.encode(object())

    @dataclasses.dataclass(frozen=True)
    class Unregistered:
        a: int
        b: int

    with pytest.raises(AssertionError, match="not a wire type"):
        wire.encode([Unregistered(1, 2)])


@pytest.mark.parametrize("value", [StatsCall(name="q"), PurgeCall(name="q"), REFUSAL])
def test_a_dataclass_of_one_field_or_many_encodes_as_its_fields_in_order(
    value: object,
) -> None:
    """A registered type's fields are read in one call where it has several, one by one
    where it has one: the bytes are those of packing ``[name, [fields...]]``."""
    assert wire.encode(value) == _packb_encode(value)
    assert wire.decode(wire.encode(value)) == value


def _packb_encode(value: object) -> bytes:
    """What ``wire.encode`` did before it kept packers: a fresh packer per call."""
    return bytes(msgpack.packb(value, default=_packb_default, use_bin_type=True))


def _packb_default(value: object) -> msgpack.ExtType:
    shape = [f.name for f in dataclasses.fields(value)]  # type: ignore[arg-type]
    fields = [getattr(value, name) for name in shape]
    return msgpack.ExtType(wire.DATACLASS, _packb_encode([type(value).__name__, fields]))


def test_kept_packers_encode_as_fresh_ones_after_errors_and_from_threads() -> None:
    """Encoding nests (a dataclass's fields are encoded by a call of their own) and runs
    on several threads: each call must write into a packer no other call is using, and a
    packer left by a failed call must not carry bytes into the next document."""
    entries = [
        Entry(index=k, term=1, kind=EntryKind.COMMAND, now_ms=5, data=bytes([k]) * 300_000)
        for k in (1, 2, 3)
    ]
    append = AppendRequest(
        src=ServerId("n1/q"),
        dst=ServerId("n2/q"),
        term=1,
        prev_index=0,
        prev_term=0,
        entries=entries,
        commit=0,
    )
    values = [v for v in VALUES if not isinstance(v, Exception)] + [append]
    expected = [_packb_encode(v) for v in values]
    with pytest.raises(TypeError):
        wire.encode([append, object()])
    assert [wire.encode(v) for v in values] == expected

    def encode_all(_: int) -> list[bytes]:
        return [wire.encode(v) for _ in range(20) for v in values]

    with ThreadPoolExecutor(4) as pool:
        for encoded in pool.map(encode_all, range(4)):
            assert encoded == expected * 20


_ENTRY_DATA = st.one_of(
    st.binary(max_size=40),
    st.integers(wire.CHUNK_BYTES_MIN - 2, 70_000).map(lambda n: b"\xab" * n),
)
_ENTRIES = st.lists(
    st.builds(
        Entry,
        index=st.integers(1, INT_MAX),
        term=st.integers(1, INT_MAX),
        kind=st.sampled_from(EntryKind),
        now_ms=st.integers(0, INT_MAX),
        data=_ENTRY_DATA,
    ),
    max_size=20,
)
_APPENDS = st.builds(
    AppendRequest,
    src=st.just(A),
    dst=st.just(B),
    term=st.integers(0, INT_MAX),
    prev_index=st.integers(0, INT_MAX),
    prev_term=st.integers(0, INT_MAX),
    entries=_ENTRIES,
    commit=st.integers(0, INT_MAX),
)
_CHUNKS = st.builds(
    SnapshotChunk,
    src=st.just(A),
    dst=st.just(B),
    term=st.integers(0, INT_MAX),
    snapshot_index=st.integers(0, INT_MAX),
    snapshot_term=st.integers(0, INT_MAX),
    offset=st.integers(0, INT_MAX),
    data=_ENTRY_DATA,
    done=st.booleans(),
    entries=_ENTRIES,
)


@settings(max_examples=200, deadline=None)
@given(st.one_of(_APPENDS, _CHUNKS, st.sampled_from(VALUES)))
def test_chunks_leave_large_bytes_out_of_the_document_and_decode_back(value: object) -> None:
    chunks = wire.encode_chunks(value)
    large = [e.data for e in getattr(value, "entries", []) if len(e.data) >= wire.CHUNK_BYTES_MIN]
    if isinstance(value, SnapshotChunk) and len(value.data) >= wire.CHUNK_BYTES_MIN:
        large.insert(0, value.data)
    assert len(chunks.blobs) == len(large)
    assert all(blob is data for blob, data in zip(chunks.blobs, large, strict=True))
    document = chunks.joined()
    assert chunks.document_bytes == len(document)
    assert chunks.blobs_bytes == sum(map(len, large))
    blobs = memoryview(b"".join(chunks.blobs)) if large else None
    assert wire.decode(document, blobs) == value
    if not large:
        assert document == wire.encode(value)


def _reference_document(value: object) -> bytes:
    """The document of ``wire.encode_chunks`` by its rule, built without the module: a
    dataclass as ``[name, [fields...]]`` in a ``DATACLASS`` extension, a byte string of
    at least ``CHUNK_BYTES_MIN`` as a ``BLOB`` extension holding its length."""

    def tree(v: object) -> object:
        if type(v) is bytes and len(v) >= wire.CHUNK_BYTES_MIN:
            return msgpack.ExtType(wire.BLOB, len(v).to_bytes(4, "big"))
        if isinstance(v, list):
            return [tree(item) for item in v]
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            fields = [tree(getattr(v, f.name)) for f in dataclasses.fields(v)]
            inner = msgpack.packb([type(v).__name__, fields], use_bin_type=True)
            return msgpack.ExtType(wire.DATACLASS, inner)
        return v

    document: bytes = msgpack.packb(tree(value), use_bin_type=True)
    return document


@settings(max_examples=300, deadline=None)
@given(_APPENDS)
def test_an_append_is_encoded_by_the_rule_of_chunks(value: AppendRequest) -> None:
    chunks = wire.encode_chunks(value)
    assert chunks.joined() == _reference_document(value)
    assert chunks.document_bytes == len(chunks.joined())
    large = [e.data for e in value.entries if len(e.data) >= wire.CHUNK_BYTES_MIN]
    assert all(blob is data for blob, data in zip(chunks.blobs, large, strict=True))
    assert chunks.blobs_bytes == sum(map(len, large))


def test_blobs_are_taken_each_once_and_only_from_a_frame_of_blobs() -> None:
    data = b"\x01" * wire.CHUNK_BYTES_MIN
    entry = Entry(index=1, term=1, kind=EntryKind.COMMAND, now_ms=0, data=data)
    chunks = wire.encode_chunks(
        AppendRequest(src=A, dst=B, term=1, prev_index=0, prev_term=0, entries=[entry], commit=0)
    )
    document = chunks.joined()
    with pytest.raises(WireError, match="without blobs"):
        wire.decode(document)
    with pytest.raises(WireError, match="past the end"):
        wire.decode(document, memoryview(data[:-1]))
    with pytest.raises(WireError, match="1 bytes of blobs stood for by nothing"):
        wire.decode(document, memoryview(data + b"x"))
    with pytest.raises(WireError, match="not its length"):
        wire.decode(msgpack.packb(msgpack.ExtType(wire.BLOB, b"\x00")), memoryview(b""))


def test_a_message_travels_as_its_field_values_in_order() -> None:
    """The wire format does not depend on how messages are constructed: a positional
    list of field values, as before constructors became keyword-only."""
    ext = msgpack.unpackb(wire.encode(REFUSAL), raw=False)
    assert ext.code == wire.DATACLASS
    assert msgpack.unpackb(ext.data, raw=False) == [
        "AppendResponse",
        ["n1/q", "n2/q", 3, False, 0, 9, 2, 5],
    ]


def test_a_dataclass_with_the_wrong_field_count_is_refused() -> None:
    short = msgpack.ExtType(wire.DATACLASS, wire.encode(["TimeoutNow", ["n1/q", "n2/q"]]))
    with pytest.raises(wire.WireError, match="TimeoutNow: 2 fields, expected 3"):
        wire.decode(msgpack.packb(short))


# --- decoding trusts nothing ------------------------------------------------------------

SAMPLES: list[object] = [
    *VALUES,
    Joined("qc-1", {"n1": "127.0.0.1:7001", "n4": "127.0.0.1:7004"}),
    *CALLS,
    *META_ANSWERS,
    Entry(1, 1, EntryKind.CONFIG, 0, b"\x92\x90\x90"),
    QueueArgs(),
    [SegmentInfo("00000001.seg", 1, 90, 4096, 80, 10)],
    CheckpointRecord("q", 90, 2, 1_700_000_000_000, 4096, 80, "manual", 1.5),
    CompactionRecord("q", "1,2", "auto", 1_700_000_000_000, 0, 3, 1, 9000, 4096, 80, 10, 0),
    QueueHistory(
        [CheckpointRecord("q", 9, 2, 1_700_000_000_000, 4096, 80, "auto", 1.5)],
        [CompactionRecord("q", "1", "manual", 1_700_000_000_000, 0, 3, 1, 9000, 4096, 80, 10, 0)],
    ),
    NoLeader("no leader"),
]
"""A value of every wire type (and an error): what the fuzz tests mutate."""


def test_the_largest_history_answer_is_a_few_hundred_bytes_a_run() -> None:
    """``Limits.history_records_max`` runs of each kind, of a queue with the longest name
    and the largest figures: what ``HistoryCall`` answers at most."""
    name, big = "n" * 200, 2**62
    most = DEFAULT_LIMITS.history_records_max
    answer = QueueHistory(
        [CheckpointRecord(name, big, big, big, big, big, "manual", 1e9)] * most,
        [CompactionRecord(name, "1,2,3", "manual", big, 1e9, big, big, big, big, big, big, big)]
        * most,
    )
    size = len(wire.encode(answer))
    assert size <= 2 * most * 512 <= DEFAULT_LIMITS.cluster_frame_bytes_max, size
    assert wire.decode(wire.encode(answer)) == answer


def _wire_types(value: object) -> set[type]:
    if isinstance(value, list | tuple):
        return set().union(*(_wire_types(v) for v in value)) if value else set()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        inner = [_wire_types(getattr(value, f.name)) for f in dataclasses.fields(value)]
        return {type(value)}.union(*inner)
    return set()


def test_every_wire_type_has_a_sample() -> None:
    assert set().union(*(_wire_types(v) for v in SAMPLES)) == set(wire._BY_CLASS)


def assert_valid(value: object) -> None:
    """Every dataclass in ``value`` passes its shape's check (types and bounds)."""
    if isinstance(value, list | tuple):
        for v in value:
            assert_valid(v)
    elif isinstance(value, dict):
        for k, v in value.items():
            assert_valid(k)
            assert_valid(v)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        wire._BY_CLASS[type(value)].check(value)
        for f in dataclasses.fields(value):
            assert_valid(getattr(value, f.name))


def decodes_or_refuses(data: bytes) -> None:
    try:
        value = wire.decode(data)
    except wire.WireError:
        return
    assert_valid(value)


PLAIN = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(1 << 63), max_value=(1 << 64) - 1)
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=8,
)
"""Any msgpack value."""


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_decode_to_a_value_or_wire_error(data: bytes) -> None:
    decodes_or_refuses(data)


@settings(max_examples=400, deadline=None)
@given(
    st.sampled_from(SAMPLES),
    st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255), st.integers(0, 2))),
)
def test_mutated_bytes_decode_to_a_value_or_wire_error(
    value: object, edits: list[tuple[int, int, int]]
) -> None:
    data = bytearray(wire.encode(value))
    for at, byte, how in edits:
        at %= len(data) + 1
        if how == 0:
            data[at : at + 1] = bytes([byte])
        elif how == 1:
            data[at:at] = bytes([byte])
        else:
            del data[at : at + 1]
        if not data:
            break
    decodes_or_refuses(bytes(data))


def _raw(data: bytes) -> object:
    """The document with extensions left as ``ExtType`` values, their payloads too."""

    def hook(code: int, payload: bytes) -> object:
        return msgpack.ExtType(code, msgpack.packb(_raw(payload), use_bin_type=True))

    return msgpack.unpackb(data, ext_hook=hook, raw=False)


def _replace(tree: object, path: list[int], new: object) -> object:
    """``tree`` with the node ``path`` leads to (indexes taken modulo) replaced."""
    if not path:
        return new
    if isinstance(tree, msgpack.ExtType):
        inner = _replace(msgpack.unpackb(tree.data, raw=False, ext_hook=msgpack.ExtType), path, new)
        return msgpack.ExtType(tree.code, msgpack.packb(inner, use_bin_type=True))
    if isinstance(tree, list) and tree:
        k = path[0] % len(tree)
        return [*tree[:k], _replace(tree[k], path[1:], new), *tree[k + 1 :]]
    return new


@settings(max_examples=400, deadline=None)
@given(
    st.sampled_from(SAMPLES),
    st.lists(st.integers(0, 1000), max_size=6),
    PLAIN
    | st.builds(msgpack.ExtType, st.sampled_from([0, 1, 2, 3]), st.binary(max_size=12))
    | st.just(msgpack.Timestamp(1, 0)),
)
def test_a_field_of_any_value_decodes_to_a_value_or_wire_error(
    value: object, path: list[int], new: object
) -> None:
    """Structure-aware mutation: a field (or an item, a name, a whole extension) of a
    valid encoding is replaced by any msgpack value."""
    tree = _replace(_raw(wire.encode(value)), path, new)
    decodes_or_refuses(msgpack.packb(tree, use_bin_type=True))


def _dataclass(name: str, fields: list[object]) -> bytes:
    return msgpack.packb(msgpack.ExtType(wire.DATACLASS, wire.encode([name, fields])))


@pytest.mark.parametrize(
    ("name", "fields", "why"),
    [
        ("Heartbeat", ["n1/q", "n2/q", True, 0, 0], r"Heartbeat\.term: bool"),
        ("Heartbeat", ["n1/q", "n2/q", -1, 0, 0], r"Heartbeat\.term: -1 is not in"),
        ("Heartbeat", ["n1/q", "n2/q", 1 << 62, 0, 0], r"Heartbeat\.term"),
        ("Heartbeat", ["n1/q", 7, 1, 0, 0], r"Heartbeat\.dst: int"),
        ("Entry", [0, 1, 0, 0, b""], r"Entry\.index: 0 is not in 1\.\."),
        ("Entry", [1, 1, 7, 0, b""], r"Entry\.kind: 7 is not a EntryKind"),
        ("SnapshotResponse", ["a", "b", 1, 1, -2, b""], r"next_offset: -2"),
        ("AppendRequest", ["a", "b", 1, 0, 0, [[1, 1, 0, 0, b""]], 0], r"entries: list"),
        ("SettleCall", ["q", "eat", ["r"], 0], r"SettleCall\.how"),
        ("PublishCall", ["q", (b"x",)], r"PublishCall\.messages"),
        ("QueueMeta", ["q", "u", {"replicas": 1}, 0, ["n1"]], r"QueueMeta\.args: dict"),
        ("UpdatePolicyCall", ["q", {"max_length": [1]}], r"UpdatePolicyCall\.changes"),
        ("CompactCall", ["q", 4], r"CompactCall\.phase"),
        ("CheckpointRecord", ["q", 1, 1, 0, 0, 0, "manual", "1"], r"duration_ms: str"),
        ("CheckpointRecord", ["q", 1, 1, 0, 0, 0, "auto", float("nan")], r"finite float"),
        ("CheckpointRecord", ["q", 1, 1, 0, 0, 0, "auto", True], r"duration_ms: bool"),
        ("Nothing", [], "not a wire type"),
        ("TimeoutNow", ["n1/q", "n2/q"], "TimeoutNow: 2 fields, expected 3"),
    ],
)
def test_a_field_not_of_its_type_is_refused(name: str, fields: list[object], why: str) -> None:
    with pytest.raises(wire.WireError, match=why):
        wire.decode(_dataclass(name, fields))


def test_the_bounds_admit_what_messages_carry() -> None:
    """The edges of the bounds decode: -1 for an installed snapshot, the largest term."""
    last = SnapshotResponse(src=A, dst=B, term=INT_MAX, snapshot_index=1, next_offset=-1)
    assert wire.decode(wire.encode(last)) == last


def test_nesting_deeper_than_the_limit_is_refused_without_recursion() -> None:
    for depth in (DEFAULT_LIMITS.wire_depth_max + 1, 3_000):
        inner: object = None
        for _ in range(depth):
            inner = msgpack.ExtType(wire.DATACLASS, msgpack.packb(["X", [inner]]))
        with pytest.raises(wire.WireError, match="nested more than"):
            wire.decode(msgpack.packb(inner))


def test_a_document_or_a_string_past_its_limit_is_refused() -> None:
    with pytest.raises(wire.WireError, match="a document of"):
        wire.decode(bytes(DEFAULT_LIMITS.wire_document_bytes_max + 1))
    long_name = PurgeCall("x" * (DEFAULT_LIMITS.wire_str_bytes_max + 1))
    with pytest.raises(wire.WireError, match="max_str_len"):
        wire.decode(wire.encode(long_name))
    many = ["x"] * (DEFAULT_LIMITS.wire_items_max + 1)
    with pytest.raises(wire.WireError, match="max_array_len"):
        wire.decode(wire.encode(many))


def test_other_extensions_and_error_shapes_are_refused() -> None:
    for ext in (
        msgpack.ExtType(9, b"\x90"),
        msgpack.ExtType(wire.ERROR, msgpack.packb(["NoLeader", 3])),
        msgpack.ExtType(wire.ERROR, msgpack.packb(["NoLeader"])),
        msgpack.ExtType(wire.DATACLASS, msgpack.packb({"Heartbeat": []})),
    ):
        with pytest.raises(wire.WireError):
            wire.decode(msgpack.packb(ext))


def test_a_received_batch_is_its_messages_in_columns() -> None:
    """A batch from a peer decodes even with lists of different lengths (each field is
    of its type); ``consistent`` is what the receiving node checks before using it."""
    batch = ReceivedBatch(
        SettleResult(0, ()),
        [1, 2],
        ["a", "b"],
        [b"x", b"y"],
        [{}, {"k": "v"}],
        [0, 3],
        [1, 2],
        [5, 6],
        9,
    )
    assert batch.consistent()
    assert batch.messages == [
        ReceivedMessage(1, "a", b"x", {}, 0, 1, 5, 9),
        ReceivedMessage(2, "b", b"y", {"k": "v"}, 3, 2, 6, 9),
    ]
    short = dataclasses.replace(batch, bodies=[b"x"])
    assert wire.decode(wire.encode(short)) == short and not short.consistent()
