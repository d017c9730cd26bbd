"""Catch-up after compaction at the storage level: the leader's checkpoint names the live
entries, the follower says which of them it already holds (committed), and only the
others travel; a new member holds none. The Raft core does not negotiate yet (it ships
every live entry); these tests drive the exchange by hand."""

from __future__ import annotations

from pyroaring import BitMap64

from engine.raft.entry import Entry, EntryKind
from engine.storage import Checkpoint, FakeDisk, HardState, NodeStorage
from tests.engine.storage.compaction.conftest import (
    UID,
    assert_intact,
    fill,
    limits,
    payload,
    reopen,
)

LIMITS = limits()


def _leader() -> tuple[NodeStorage, Checkpoint]:
    leader = fill(FakeDisk(), LIMITS, 300)
    live = BitMap64(range(3, 301, 11))
    cp = Checkpoint(300, 1, 0, b"", live, b"state")
    leader.write_checkpoint(UID, cp)
    leader.compact(UID, "auto")
    return leader, cp


def _catch_up(leader: NodeStorage, follower: NodeStorage, cp: Checkpoint) -> int:
    held = follower.held_live(UID, cp.live_indexes)  # the follower's answer to the checkpoint
    missing = [leader.log(UID).read(i) for i in cp.live_indexes - held]
    follower.install_snapshot(UID, cp, missing)
    follower.sync()
    return len(missing)


def test_a_lagging_follower_receives_only_the_live_entries_it_lacks() -> None:
    leader, cp = _leader()
    disk = FakeDisk()
    follower = reopen(disk, LIMITS)
    follower.append(UID, [Entry(i, 1, EntryKind.COMMAND, i, payload(i)) for i in range(1, 201)])
    follower.save_hard_state(UID, HardState(1, None, 180))  # 181..200 are not known committed
    follower.sync()
    sent = _catch_up(leader, follower, cp)
    assert sent == len(cp.live_indexes - BitMap64(range(1, 181)))
    assert_intact(follower, cp.live_indexes, 300)
    # then normal replication takes over after the snapshot
    follower.append(UID, [Entry(i, 2, EntryKind.COMMAND, i, payload(i)) for i in range(301, 311)])
    follower.sync()
    assert follower.log(UID).last_index() == 310
    again = reopen(disk, LIMITS)
    assert_intact(again, cp.live_indexes, 300)
    assert again.log(UID).snapshot_live == cp.live_indexes


def test_a_new_member_receives_every_live_entry() -> None:
    leader, cp = _leader()
    disk = FakeDisk()
    follower = reopen(disk, LIMITS)
    assert _catch_up(leader, follower, cp) == len(cp.live_indexes)
    assert_intact(follower, cp.live_indexes, 300)
    assert_intact(reopen(disk, LIMITS), cp.live_indexes, 300)
