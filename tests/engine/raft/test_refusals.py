"""A peer's message that no correct peer sends is refused and counted: it never reaches
an assertion of the core nor breaks an invariant, whatever its (well-typed) content."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st
from pyroaring import BitMap64

from engine.raft.config import Configuration
from engine.raft.entry import Entry, EntryKind
from engine.raft.events import Propose, ReadIndex, Receive, Tick
from engine.raft.kv import encode_put
from engine.raft.messages import (
    INT_MAX,
    AppendRequest,
    AppendResponse,
    Heartbeat,
    HeartbeatResponse,
    Message,
    SnapshotChunk,
    SnapshotResponse,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)
from engine.raft.server import RaftServer
from tests.engine.raft.harness import LIMITS, Cluster, append_request, append_response, sid

LIMITS_SMALL = dataclasses.replace(LIMITS, snapshot_chunk_bytes=16)


def _cluster() -> Cluster:
    """``a`` leads ``b`` and ``c``; ``c`` lags behind a snapshot ``a`` took."""
    c = Cluster(["a", "b", "c"], limits=LIMITS_SMALL)
    c.elect("a")
    for n in range(3):
        c.step("a", Propose(n, (encode_put(f"k{n}", b"v"),)))
    c.stabilize()
    c.cut = {"c"}
    for n in range(3, 6):
        c.step("a", Propose(n, (encode_put(f"k{n % 2}", b"w"),)))
    c.stabilize()
    c.tick(LIMITS.heartbeat_interval_ms, deliver=True)
    c.take_snapshot("a")
    c.cut = set()
    return c


def _refused(c: Cluster, name: str, message: Message, reason: str) -> None:
    """``message`` to ``name`` is refused for ``reason``, changing nothing else."""
    raft = c[name]
    before = (raft.refused, raft.term, raft.commit, raft.log.last_index(), raft.role)
    c.step(name, Receive(message))
    assert raft.refusal == reason
    assert (raft.refused - 1, raft.term, raft.commit, raft.log.last_index(), raft.role) == before


def _entry(index: int, term: int, kind: EntryKind = EntryKind.COMMAND, data: bytes = b"") -> Entry:
    return Entry(index, term, kind, 0, data)


def test_entries_that_do_not_follow_prev_index_are_refused() -> None:
    c = _cluster()
    b = c["b"]
    last, term = b.log.last_index(), b.term
    gap = [_entry(last + 1, term), _entry(last + 3, term)]
    msg = append_request("a", "b", term, prev_index=last, prev_term=term, entries=gap, commit=0)
    _refused(c, "b", msg, "append_entries_not_in_sequence")
    early = [_entry(last, term)]
    msg = append_request("a", "b", term, prev_index=last, prev_term=term, entries=early, commit=0)
    _refused(c, "b", msg, "append_entries_not_in_sequence")


def test_entries_whose_terms_decrease_or_pass_the_message_term_are_refused() -> None:
    c = _cluster()
    b = c["b"]
    last, term = b.log.last_index(), b.term
    down = [_entry(last + 1, term + 2), _entry(last + 2, term + 1)]
    msg = append_request(
        "a", "b", term + 2, prev_index=last, prev_term=term, entries=down, commit=0
    )
    _refused(c, "b", msg, "append_terms_decrease")
    ahead = [_entry(last + 1, term + 1)]
    msg = append_request("a", "b", term, prev_index=last, prev_term=term, entries=ahead, commit=0)
    _refused(c, "b", msg, "append_entries_past_term")


def test_a_configuration_entry_that_does_not_decode_is_refused() -> None:
    c = _cluster()
    b = c["b"]
    last, term = b.log.last_index(), b.term
    for junk in (b"\xc1", b"\x92\x91\x01\x90", b"\x92\x92\xa1b\xa1a\x90", b"\x92\x90\x90"):
        entries = [_entry(last + 1, term, EntryKind.CONFIG, junk)]
        msg = append_request(
            "a", "b", term, prev_index=last, prev_term=term, entries=entries, commit=0
        )
        _refused(c, "b", msg, "configuration_undecodable")
    good = Configuration((sid("a"), sid("b"), sid("c"))).encode()
    entries = [_entry(last + 1, term, EntryKind.CONFIG, good)]
    c.step(
        "b",
        Receive(
            append_request(
                "a", "b", term, prev_index=last, prev_term=term, entries=entries, commit=0
            )
        ),
    )
    assert b.log.last_index() == last + 1


def test_an_entry_larger_than_storage_takes_is_refused() -> None:
    c = _cluster()
    b = c["b"]
    last, term = b.log.last_index(), b.term
    big = [_entry(last + 1, term, data=bytes(LIMITS.entry_bytes_max + 1))]
    msg = append_request("a", "b", term, prev_index=last, prev_term=term, entries=big, commit=0)
    _refused(c, "b", msg, "entry_too_large")


def test_a_second_leader_in_a_term_is_refused() -> None:
    """Before: the leader asserted ``two leaders in term``, or campaigned against itself
    on a ``TimeoutNow`` (keeping its leader state); a follower took the second leader."""
    c = _cluster()
    a, term = c["a"], c["a"].term
    hb = Heartbeat(src=sid("b"), dst=sid("a"), term=term, commit=0, read_seq=0)
    _refused(c, "a", hb, "two_leaders")
    last = a.log.last_index()
    msg = append_request("c", "a", term, prev_index=last, prev_term=term, commit=0)
    _refused(c, "a", msg, "two_leaders")
    _refused(c, "a", TimeoutNow(src=sid("b"), dst=sid("a"), term=term), "two_leaders")
    hb = Heartbeat(src=sid("c"), dst=sid("b"), term=term, commit=0, read_seq=0)
    _refused(c, "b", hb, "two_leaders")
    assert c["b"].leader == "a"


def test_answers_past_the_leaders_log_are_refused() -> None:
    c = _cluster()
    a = c["a"]
    term, last = a.term, a.log.last_index()
    msg = append_response("b", "a", term, success=True, match_index=last + 1)
    _refused(c, "a", msg, "match_past_log")
    msg = append_response("b", "a", term, success=False, rejected_prev_index=last + 5)
    _refused(c, "a", msg, "rejection_past_log")


def test_an_echo_of_a_read_round_not_started_is_refused() -> None:
    c = _cluster()
    a = c["a"]
    c.step("a", ReadIndex(77))
    c.take()
    seq = a.reads.seq
    for peer in ("b", "c"):
        msg = HeartbeatResponse(src=sid(peer), dst=sid("a"), term=a.term, read_seq=seq + 1)
        _refused(c, "a", msg, "read_round_not_started")
    assert [r for _s, r, _i in a.reads.pending] == [77], "the read waits for a real round"


def test_a_snapshot_whose_bytes_do_not_decode_is_refused_and_starts_over() -> None:
    """Before: an exception from msgpack, or the assertion that the snapshot is the one
    announced."""
    c = _cluster()
    b = c["b"]
    term = b.term
    real = c.take_snapshot("a")
    other = dataclasses.replace(real, index=real.index + 50)
    for data, reason in (
        (b"\x93\x01", "snapshot_undecodable"),
        (other.encode(), "snapshot_not_as_announced"),
    ):
        chunk = SnapshotChunk(
            src=sid("a"),
            dst=sid("b"),
            term=term,
            snapshot_index=real.index + 100,
            snapshot_term=term,
            offset=0,
            data=data,
            done=True,
        )
        _refused(c, "b", chunk, reason)
        assert b.incoming_snapshot is None
        answer = c.take(SnapshotResponse, "a")[-1]
        assert isinstance(answer, SnapshotResponse) and answer.next_offset == 0


def test_a_missing_set_that_does_not_deserialize_is_refused() -> None:
    """Before: ``ValueError`` or ``IndexError`` from the bitmap."""
    c = _cluster()
    a = c["a"]
    # c stalled while cut off: a finds it and starts sending c its snapshot
    c.tick(LIMITS.append_stall_ms + LIMITS.heartbeat_interval_ms)
    pr = a.progress[sid("c")]
    assert pr.snapshot_index
    for junk in (b"\x01junk", b"\x00"):
        msg = SnapshotResponse(
            src=sid("c"),
            dst=sid("a"),
            term=a.term,
            snapshot_index=pr.snapshot_index,
            next_offset=pr.snapshot_offset + 16,
            missing=junk,
        )
        _refused(c, "a", msg, "missing_set_undecodable")


def test_a_message_not_addressed_here_or_from_this_server_is_refused() -> None:
    c = _cluster()
    term = c["b"].term
    _refused(
        c,
        "b",
        Heartbeat(src=sid("a"), dst=sid("c"), term=term + 1, commit=0, read_seq=0),
        "not_addressed_here",
    )
    _refused(
        c,
        "b",
        Heartbeat(src=sid("b"), dst=sid("b"), term=term + 1, commit=0, read_seq=0),
        "from_this_server",
    )


def test_a_candidate_whose_log_is_past_its_term_gets_no_vote() -> None:
    c = _cluster()
    b = c["b"]
    msg = VoteRequest(
        src=sid("c"),
        dst=sid("b"),
        term=b.term + 1,
        last_index=INT_MAX,
        last_term=b.term + 2,
        pre=False,
        transfer=True,
    )
    _refused(c, "b", msg, "vote_log_past_term")
    assert b.vote == sid("a")


# --- any well-typed message -------------------------------------------------------------

NAMES = ["a", "b", "c", "x"]


@st.composite
def _messages(draw: st.DrawFn, c: Cluster, target: str) -> Message:
    """A message to ``target``, its fields drawn near what it holds, or anywhere."""
    s: RaftServer = c[target]
    last = s.log.last_index()

    def term() -> int:
        near = st.integers(max(0, s.term - 1), s.term + 2)
        return draw(near | st.integers(0, INT_MAX))

    def index() -> int:
        return draw(st.integers(0, last + 3) | st.integers(0, INT_MAX))

    def entries(first: int, kinds: list[EntryKind]) -> list[Entry]:
        n = draw(st.integers(0, 3))
        contiguous = draw(st.booleans())
        out = []
        for k in range(n):
            at = first + k if contiguous else draw(st.integers(1, last + 5))
            kind = draw(st.sampled_from(kinds))
            data = draw(st.sampled_from([b"", b"\xc1", b"\x92\x91\xa1a\x90", CONFIG]))
            out.append(Entry(at, draw(st.integers(1, s.term + 2)), kind, 0, data))
        return out

    src, dst = sid(draw(st.sampled_from(NAMES))), sid(draw(st.sampled_from([target, target, "b"])))
    kind = draw(st.sampled_from(KINDS))
    common = {"src": src, "dst": dst, "term": term()}
    if kind is AppendRequest:
        prev = index()
        return AppendRequest(
            **common,
            prev_index=prev,
            prev_term=term(),
            commit=index(),
            entries=entries(prev + 1, list(EntryKind)),
        )
    if kind is AppendResponse:
        return AppendResponse(
            **common,
            success=draw(st.booleans()),
            match_index=index(),
            rejected_prev_index=index(),
            conflict_term=term(),
            conflict_index=index(),
        )
    if kind is Heartbeat:
        return Heartbeat(**common, commit=index(), read_seq=draw(st.integers(0, 5)))
    if kind is HeartbeatResponse:
        return HeartbeatResponse(
            **common, read_seq=draw(st.integers(0, 5)), repairing=draw(st.booleans())
        )
    if kind is VoteRequest:
        return VoteRequest(
            **common,
            last_index=index(),
            last_term=term(),
            pre=draw(st.booleans()),
            transfer=draw(st.booleans()),
        )
    if kind is VoteResponse:
        return VoteResponse(**common, granted=draw(st.booleans()), pre=draw(st.booleans()))
    if kind is SnapshotChunk:
        snap = c.nodes["a"].storage.snapshot()
        whole = snap.encode() if snap is not None else b"\x95"
        offset = draw(st.sampled_from([0, 16, len(whole)]) | st.integers(0, INT_MAX))
        data = draw(st.sampled_from([whole[offset : offset + 16], whole, b"\x00junk"]))
        snapshot_index = (
            draw(st.sampled_from([snap.index if snap else 1])) if draw(st.booleans()) else index()
        )
        return SnapshotChunk(
            **common,
            snapshot_index=snapshot_index,
            snapshot_term=term(),
            offset=offset,
            data=data,
            done=draw(st.booleans()),
            entries=entries(1, [EntryKind.COMMAND]),
        )
    if kind is SnapshotResponse:
        missing = draw(st.sampled_from([b"", b"\x01junk", BitMap64([1, 2, 9]).serialize()]))
        return SnapshotResponse(
            **common,
            snapshot_index=index(),
            next_offset=draw(st.integers(-1, 64) | st.integers(-1, INT_MAX)),
            missing=missing,
        )
    return TimeoutNow(**common)


CONFIG = Configuration((sid("a"), sid("b"), sid("x"))).encode()
KINDS = [
    AppendRequest,
    AppendResponse,
    Heartbeat,
    HeartbeatResponse,
    VoteRequest,
    VoteResponse,
    SnapshotChunk,
    SnapshotResponse,
    TimeoutNow,
]


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_no_well_typed_message_makes_a_server_raise_or_break_an_invariant(
    data: st.DataObject,
) -> None:
    """Messages of any content to the leader and to the followers, each followed by the
    group's own traffic: every step keeps every server's invariants
    (``Cluster.step`` checks them) and raises nothing."""
    c = _cluster()
    for _ in range(data.draw(st.integers(1, 8))):
        target = data.draw(st.sampled_from(["a", "b", "c"]))
        c.step(target, Receive(data.draw(_messages(c, target))))
        for _ in range(data.draw(st.integers(0, 3))):
            batch, c.sent = c.sent, []
            c.deliver(batch)
        if data.draw(st.booleans()):
            c.now_ms += LIMITS.heartbeat_interval_ms
            for name in c.nodes:
                c.step(name, Tick(c.now_ms))
    for name in c.nodes:
        c[name].check_invariants()
