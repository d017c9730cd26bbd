"""The rules that hold of one Raft server between any two events.

``RaftServer.check_invariants`` runs these after every step of the simulator and the
tests' harness; each failed assertion names the rule it broke. Kept apart from the
server so that the event handling reads without them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.raft.role import Role

if TYPE_CHECKING:
    from engine.raft.server import RaftServer


def check(server: RaftServer) -> None:
    """What holds between any two events of one server, outside its shared empties."""
    log = server.log
    last = log.last_index()
    assert log.snapshot_index <= server.applied <= server.commit <= last, (
        f"{server.id}: snapshot {log.snapshot_index} <= applied {server.applied} "
        f"<= commit {server.commit} <= last index {last}"
    )
    assert log.snapshot_index - 1 <= log.stable_last <= last, f"{server.id}: stable_last"
    configs = server.configs
    assert configs[-1][0] <= last, f"{server.id}: a configuration past the log"
    if len(configs) > 1:
        for k in range(1, len(configs)):
            assert configs[k - 1][0] < configs[k][0], f"{server.id}: configurations out of order"
    assert not server.repairing or server.role is Role.FOLLOWER, "a repairing server follows"
    if server.role is Role.LEADER:
        _check_leader(server)
        return
    assert server.leader != server.id, f"{server.id}: {server.role.name} names itself leader"
    assert not server.progress and not server.uncommitted, f"{server.id}: leader state kept"
    assert not server.uncommitted_bytes, f"{server.id}: uncommitted bytes without entries"
    assert server.reads.is_empty(), f"{server.id}: reads held by a non-leader"
    ms = server.membership
    assert ms.catch_up is None and ms.change is None and ms.transfer is None
    if server.role is not Role.FOLLOWER:
        assert server.leader is None, f"{server.id}: a candidate knows no leader"
    if server.role is Role.CANDIDATE:
        assert server.vote == server.id, f"{server.id}: a candidate votes for itself"


def _check_leader(server: RaftServer) -> None:
    """What holds of a leader: its vote, its followers' progress, reads and proposals."""
    assert server.leader == server.id and server.vote == server.id, f"{server.id}: leader's vote"
    last = server.log.last_index()
    assert 0 < server.term_start_index <= last, f"{server.id}: term start"
    config = server.config
    for peer, pr in server.progress.items():
        member = peer in config.voters or peer in config.learners
        assert member and peer != server.id, f"{server.id}: progress of a non-member {peer}"
        assert pr.match < pr.next and pr.match <= last, f"{server.id}: progress of {peer}"
    cu = server.membership.catch_up
    assert cu is None or cu.server in server.progress, f"{server.id}: catch-up of a stranger"
    pending = server.reads.pending
    # Reads record the commit index, which never decreases: the last is the highest.
    assert not pending or pending[-1][2] <= server.commit, f"{server.id}: read above commit"
    uncommitted = server.uncommitted
    if uncommitted:
        assert uncommitted[-1][0] <= last, f"{server.id}: uncommitted past the log"
        size = sum(size for _last, size in uncommitted)
        assert server.uncommitted_bytes == size, f"{server.id}: uncommitted bytes"
    else:
        assert not server.uncommitted_bytes, f"{server.id}: uncommitted bytes without entries"
