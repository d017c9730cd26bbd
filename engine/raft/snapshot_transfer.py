"""Sending a snapshot to a follower that lags behind the leader's log, and receiving one.

Rules:
- The leader ships the snapshot's checkpoint in chunks of ``snapshot_chunk_bytes``, one
  in flight; the follower answers each with the offset it wants next. Once it holds the
  whole checkpoint, it answers with the set of live indexes (entries the machine's state
  still refers to) it lacks; it holds the others as committed entries after its own
  snapshot, and by log matching they are the leader's. The leader then sends those
  entries, read from storage as they are sent, bounded per message like appends.
- Offsets ``0 .. len(checkpoint)`` address the checkpoint's bytes, past them the
  ``k``-th missing live entry: an answer that does not fit what the follower holds is
  answered with what it wants, so lost, repeated and reordered messages, and a restart
  of either side, only cost a resend.
- A follower whose log already holds the snapshot's last entry keeps its log (Raft
  section 7); one that installs hands the snapshot and the entries to storage in
  ``Ready.snapshot_to_install`` and counts them durable on ``SnapshotInstalled``.
- If a live entry is gone from the leader's storage (a newer snapshot replaced this
  one), the leader starts over from a probe.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pyroaring import BitMap64

from engine.ids import ServerId
from engine.limits import Limits
from engine.raft import replication
from engine.raft.entry import Entry, LogStore
from engine.raft.messages import SnapshotChunk, SnapshotResponse
from engine.raft.progress import Progress, ProgressState
from engine.raft.snapshot import Snapshot

if TYPE_CHECKING:
    from engine.raft.server import RaftServer

# --- leader side ----------------------------------------------------------------------


def begin(s: RaftServer, peer: ServerId, pr: Progress) -> bool:
    """Start shipping the current snapshot to ``peer``; says whether one was sent."""
    snap = s.snapshot
    if snap is None or snap.index < s.log.snapshot_index:
        return False  # the runtime hands the current one in with SnapshotTaken
    pr.become_snapshot(snap.index, snap.term, snap.encode(), s.now_ms)
    send_chunk(s, peer, pr)
    return True


def send_chunk(s: RaftServer, peer: ServerId, pr: Progress) -> None:
    """The checkpoint's bytes from the offset the follower wants, or past them the
    next live entries it lacks (read from storage now, bounded per message)."""
    size = s.limits.snapshot_chunk_bytes
    whole = pr.snapshot_data
    start = pr.snapshot_offset
    entries: list[Entry] = []
    if start >= len(whole) and pr.snapshot_missing is None:
        start = (len(whole) - 1) // size * size  # ask again for the missing set
    if start < len(whole):
        data = whole[start : start + size]
        done = start + len(data) >= len(whole)
    else:
        assert pr.snapshot_missing is not None
        data = b""
        entries = missing_entries(s.log.store, pr.snapshot_missing, start - len(whole), s.limits)
        if not entries:
            # A live entry is gone: a newer snapshot replaced this one; start over.
            pr.become_probe(pr.match + 1)
            return
        done = start - len(whole) + len(entries) >= len(pr.snapshot_missing)
    chunk = SnapshotChunk(
        src=s.id,
        dst=peer,
        term=s.term,
        snapshot_index=pr.snapshot_index,
        snapshot_term=pr.snapshot_term,
        offset=start,
        data=data,
        done=done,
        entries=entries,
    )
    pr.snapshot_sent_ms = s.now_ms
    s.rd.messages.append(chunk)


def missing_entries(store: LogStore, missing: BitMap64, skip: int, limits: Limits) -> list[Entry]:
    """The live entries ``missing[skip:]`` within one message's bounds; empty if one
    of them is no longer stored."""
    out: list[Entry] = []
    size = 0
    for index in missing[skip : skip + limits.append_entries_per_message_max]:
        try:
            entry = store.entry(index)
        except LookupError:
            return []
        assert entry.index == index
        size += len(entry.data)
        if out and size > limits.append_bytes_per_message_max:
            break
        out.append(entry)
    return out


def on_response(s: RaftServer, msg: SnapshotResponse) -> None:
    pr = s.heard_from_follower(msg.src)
    if pr is None:
        return
    if pr.state is not ProgressState.SNAPSHOT or msg.snapshot_index != pr.snapshot_index:
        return
    if msg.next_offset < 0:
        pr.maybe_update(pr.snapshot_index, s.now_ms)
        pr.become_probe(pr.snapshot_index + 1)
        replication.maybe_send_append(s, msg.src, pr, allow_empty=True)
        return
    if msg.missing:
        # The follower's latest word (it may have restarted and lost some entries).
        try:
            pr.snapshot_missing = BitMap64.deserialize(msg.missing)
        except (ValueError, IndexError):
            s.refuse("missing_set_undecodable")
            return
    if msg.next_offset > len(pr.snapshot_data) and pr.snapshot_missing is None:
        return  # the stall timer asks again with a piece of the checkpoint
    pr.snapshot_offset = msg.next_offset
    send_chunk(s, msg.src, pr)


# --- follower side --------------------------------------------------------------------


@dataclass(slots=True)
class Incoming:
    """A snapshot a follower is receiving: the checkpoint's bytes, then (once decoded)
    the live entries it lacks."""

    index: int
    term: int
    data: bytearray
    snapshot: Snapshot | None = None
    missing: BitMap64 | None = None
    entries: list[Entry] = field(default_factory=list)

    def next_offset(self) -> int:
        return len(self.data) + len(self.entries)

    def expects(self, entries: list[Entry]) -> bool:
        """``entries`` are the next ones of the missing set, in order."""
        assert self.missing is not None
        k = len(self.entries)
        return [e.index for e in entries] == list(self.missing[k : k + len(entries)])


@dataclass(frozen=True, slots=True)
class Receipt:
    """What a follower answers to a chunk, and the snapshot it installs if complete."""

    next_offset: int
    missing: BitMap64 | None = None
    installed: tuple[Snapshot, list[Entry]] | None = None
    refused: str | None = None
    """The checkpoint's bytes decode to no snapshot, or to another one: the transfer
    starts over (``next_offset`` 0)."""


def receive(inc: Incoming | None, msg: SnapshotChunk, held_lo: int, held_hi: int) -> Receipt:
    """Take ``msg`` into ``inc`` (the transfer under way, or a new one when ``msg``
    starts one). The follower holds committed entries ``held_lo < index <= held_hi``."""
    if inc is None or (inc.index, inc.term) != (msg.snapshot_index, msg.snapshot_term):
        return Receipt(0)
    if inc.snapshot is None:
        return _receive_checkpoint_piece(inc, msg, held_lo, held_hi)
    if msg.entries and msg.offset == inc.next_offset() and inc.expects(msg.entries):
        inc.entries.extend(msg.entries)
        return _maybe_complete(inc, msg)
    # Out of order, or the leader works from another missing set (an answer from
    # before a restart of ours): say again what we lack.
    return Receipt(inc.next_offset(), inc.missing)


def _receive_checkpoint_piece(
    inc: Incoming, msg: SnapshotChunk, held_lo: int, held_hi: int
) -> Receipt:
    if msg.entries or len(inc.data) != msg.offset:
        return Receipt(len(inc.data))
    inc.data.extend(msg.data)
    if not msg.done:
        return Receipt(len(inc.data))
    snap = Snapshot.parse(bytes(inc.data))
    if snap is None:
        return Receipt(0, refused="snapshot_undecodable")
    if (snap.index, snap.term) != (inc.index, inc.term):
        return Receipt(0, refused="snapshot_not_as_announced")
    inc.snapshot = snap
    inc.missing = snap.live_indexes - held_live(snap.live_indexes, held_lo, held_hi)
    return _maybe_complete(inc, msg)


def held_live(live: BitMap64, held_lo: int, held_hi: int) -> BitMap64:
    """The indexes of ``live`` in ``held_lo < index <= held_hi``: committed entries
    stored after the follower's own snapshot are the leader's, so they need not travel."""
    if held_hi <= held_lo:
        return BitMap64()
    held: BitMap64 = live[live.rank(held_lo) : live.rank(held_hi)]
    return held


def _maybe_complete(inc: Incoming, msg: SnapshotChunk) -> Receipt:
    assert inc.snapshot is not None and inc.missing is not None
    if len(inc.entries) < len(inc.missing):
        # The missing set answers a piece of the checkpoint only, not every message.
        return Receipt(inc.next_offset(), None if msg.entries else inc.missing)
    assert BitMap64(e.index for e in inc.entries) == inc.missing, "the entries asked for"
    return Receipt(-1, None, (inc.snapshot, inc.entries))


def on_chunk(s: RaftServer, msg: SnapshotChunk) -> None:
    s.heard_from_leader(msg.src)
    if msg.snapshot_index <= s.commit:
        _reply(s, msg, -1)
        return
    if s.log.matches(msg.snapshot_index, msg.snapshot_term):
        # Our log holds the snapshot's last entry: keep it and what follows (section 7).
        s.commit = msg.snapshot_index
        s.incoming_snapshot = None
        _reply(s, msg, -1)
        return
    key = (msg.snapshot_index, msg.snapshot_term)
    inc = s.incoming_snapshot
    resumes = inc is not None and (inc.index, inc.term) == key and inc.snapshot is not None
    if msg.offset == 0 and not msg.entries and not resumes:
        inc = s.incoming_snapshot = Incoming(*key, bytearray())
    receipt = receive(inc, msg, s.log.snapshot_index, min(s.commit, s.log.stable_last))
    if receipt.refused is not None:
        s.refuse(receipt.refused)
        s.incoming_snapshot = None
    if receipt.installed is not None:
        s.incoming_snapshot = None
        _install(s, *receipt.installed)
    _reply(s, msg, receipt.next_offset, receipt.missing)


def _install(s: RaftServer, snap: Snapshot, entries: list[Entry]) -> None:
    s.log.restore(snap.index, snap.term)
    s.log.stable_last = s.log.snapshot_index - 1
    s.commit = s.applied = snap.index
    s.snapshot = snap
    s.configs = [(snap.index, snap.config)]
    s.pending_install = (snap, entries)


def on_installed(s: RaftServer, index: int, term: int) -> None:
    if index == s.log.snapshot_index and term == s.log.snapshot_term:
        s.log.stable_last = max(s.log.stable_last, index)


def _reply(
    s: RaftServer, msg: SnapshotChunk, next_offset: int, missing: BitMap64 | None = None
) -> None:
    """With ``missing``: tell the leader which live entries this server lacks."""
    resp = SnapshotResponse(
        src=s.id,
        dst=msg.src,
        term=s.term,
        snapshot_index=msg.snapshot_index,
        next_offset=next_offset,
        missing=b"" if missing is None else missing.serialize(),
    )
    s.rd.messages_after_persist.append(resp)


__all__ = [
    "Incoming",
    "Receipt",
    "begin",
    "held_live",
    "missing_entries",
    "on_chunk",
    "on_installed",
    "on_response",
    "receive",
    "send_chunk",
]
