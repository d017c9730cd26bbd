"""The metadata machine, one rule at a time (the stateful test covers them together)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from engine.cluster import MetaMachine, encode_command
from engine.cluster import meta_commands as mc
from engine.cluster.queue_changes import queue_uid
from engine.cluster.records import queue_from_wire, record_to_wire
from engine.cluster.replies import (
    MembersChanged,
    MetaChanged,
    Ok,
    QueueCreated,
    QueueDeleting,
    QueueExists,
    Rejected,
)
from engine.errors import Conflict, NotFound, QueueConflict, QueueNotFound, ValidationFailed
from engine.limits import Limits
from engine.queue import QueuePolicy
from engine.raft.state_machine import ApplyMeta, CheckpointRequest, ReleaseCursor

P = QueuePolicy()


class Log:
    """A machine and the entries applied to it so far."""

    def __init__(self, limits: Limits | None = None, nodes: int = 3) -> None:
        self.machine = MetaMachine(limits or Limits())
        self.entries: list[bytes] = []
        self.effects: list[Any] = []
        if nodes:
            self.do(mc.Bootstrap("c1"))
            for n in range(1, nodes + 1):
                self.do(mc.AddNode(f"n{n}", f"127.0.0.1:700{n}"))

    @property
    def index(self) -> int:
        return len(self.entries)

    def do(self, command: mc.MetaCommand) -> Any:
        data = encode_command(command)
        self.entries.append(data)
        reply, self.effects = self.machine.apply(ApplyMeta(self.index, 1, 5_000 + self.index), data)
        self.machine.check_invariants()
        return reply

    def create(self, name: str, replicas: int = 3) -> QueueCreated:
        reply = self.do(mc.CreateQueue(name, replicas, P))
        assert isinstance(reply, QueueCreated), reply
        return reply

    def report_all_created(self, uid: str) -> None:
        record = self.machine.queue_by_uid(uid)
        assert record is not None
        for node in record.members:
            assert self.do(mc.ReplicaCreated(node, uid)) == Ok(True)


def _error(reply: object) -> type[Exception]:
    assert isinstance(reply, Rejected), reply
    return reply.error


def test_only_bootstrap_is_taken_before_the_cluster_has_an_id() -> None:
    log = Log(nodes=0)
    assert _error(log.do(mc.AddNode("n1", "h:1"))) is Conflict
    assert log.do(mc.Bootstrap("c1")) == Ok(True)
    assert log.do(mc.Bootstrap("c1")) == Ok(False)
    assert _error(log.do(mc.Bootstrap("c2"))) is Conflict
    assert log.machine.cluster_id == "c1"


def test_the_uid_comes_from_the_index_and_the_cluster_id() -> None:
    one, two = Log(), Log()
    first = one.create("orders")
    assert first == two.create("orders")
    assert first.uid == queue_uid("c1", one.index) and first.uid.startswith(f"{one.index:016x}")
    assert len(first.uid) == 32 and queue_uid("c2", one.index) != first.uid


def test_a_create_of_an_existing_name_answers_its_uid_or_conflicts() -> None:
    log = Log()
    created = log.create("orders")
    assert log.do(mc.CreateQueue("orders", 3, P)) == QueueExists(created.uid)
    assert _error(log.do(mc.CreateQueue("orders", 2, P))) is QueueConflict
    assert _error(log.do(mc.CreateQueue("orders", 3, QueuePolicy(max_length=1)))) is QueueConflict
    assert len(log.machine.queues) == 1


def test_a_create_asks_for_no_more_replicas_than_active_nodes() -> None:
    log = Log()
    log.do(mc.SetNodeState("n3", "draining"))
    reply = log.do(mc.CreateQueue("orders", 3, P))
    assert isinstance(reply, Rejected) and reply.error is ValidationFailed
    assert reply.detail == "replicas must be 1..2 (active nodes in the cluster)"
    assert log.create("orders", 2).members == ("n1", "n2")


def test_a_queue_is_live_once_a_majority_of_its_members_hold_a_replica() -> None:
    log = Log()
    uid = log.create("orders").uid
    assert log.do(mc.ReplicaCreated("n1", uid)) == Ok(True)
    assert log.machine.queues["orders"].state == "creating"
    assert log.do(mc.ReplicaCreated("n1", uid)) == Ok(False)
    assert log.do(mc.ReplicaCreated("n3", uid)) == Ok(True)
    record = log.machine.queues["orders"]
    assert (record.state, record.live_index, record.created) == ("live", log.index, ("n1", "n3"))
    assert log.effects == [MetaChanged(log.index, queues=("orders",))]


def test_a_delete_waits_for_every_member_then_frees_the_name() -> None:
    log = Log()
    old = log.create("orders").uid
    log.report_all_created(old)
    assert log.do(mc.DeleteQueue("orders")) == QueueDeleting(old)
    assert log.do(mc.DeleteQueue("orders", old)) == QueueDeleting(old)
    assert _error(log.do(mc.CreateQueue("orders", 3, P))) is QueueConflict
    assert log.do(mc.ReplicaDropped("n1", old)) == Ok(True)
    assert log.do(mc.ReplicaDropped("n2", old)) == Ok(True)
    assert log.machine.queues["orders"].state == "deleting"
    assert log.do(mc.ReplicaDropped("n3", old)) == Ok(True)
    gone = log.machine.queues["orders"]
    assert (gone.state, gone.tombstone_index) == ("tombstone", log.index)
    assert _error(log.do(mc.DeleteQueue("orders"))) is QueueNotFound
    new = log.create("orders").uid
    assert new != old and log.machine.queue_by_uid(old) is None
    assert _error(log.do(mc.ReplicaDropped("n1", old))) is QueueNotFound
    assert _error(log.do(mc.DeleteQueue("orders", old))) is QueueNotFound
    assert log.machine.queues["orders"].uid == new


def test_reports_that_come_late_or_from_elsewhere_change_nothing() -> None:
    log = Log(nodes=4)
    uid = log.create("orders").uid
    record = log.machine.queues["orders"]
    stranger = next(n for n in ("n1", "n2", "n3", "n4") if n not in record.members)
    assert _error(log.do(mc.ReplicaCreated(stranger, uid))) is Conflict
    assert _error(log.do(mc.ReplicaDropped(record.members[0], uid))) is QueueConflict
    assert log.do(mc.ReplicaDropped(stranger, uid)) == Ok(False)
    log.do(mc.DeleteQueue("orders"))
    assert log.do(mc.ReplicaCreated(record.members[0], uid)) == Ok(False)


def test_members_change_one_generation_at_a_time() -> None:
    log = Log(nodes=4)
    created = log.create("orders")
    newcomer = next(n for n in ("n1", "n2", "n3", "n4") if n not in created.members)
    reply = log.do(mc.AddMember(created.uid, newcomer, 1))
    assert reply == MembersChanged(created.uid, ("n1", "n2", "n3", "n4"), 2)
    assert _error(log.do(mc.RemoveMember(created.uid, newcomer, 1))) is Conflict
    assert _error(log.do(mc.AddMember(created.uid, newcomer, 2))) is QueueConflict
    leaving = created.leader
    reply = log.do(mc.RemoveMember(created.uid, leaving, 2))
    assert isinstance(reply, MembersChanged) and leaving not in reply.members
    record = log.machine.queues["orders"]
    assert record.leader in record.members and record.generation == 3
    assert leaving not in record.founders and record.bootstrap == created.members


def test_the_last_member_is_removed_by_deleting_the_queue() -> None:
    log = Log()
    created = log.create("orders", 1)
    assert _error(log.do(mc.RemoveMember(created.uid, created.members[0], 1))) is QueueConflict


def test_a_node_is_forgotten_only_once_it_holds_no_replica() -> None:
    log = Log()
    live = log.create("live", 3).uid
    dying = log.create("dying", 3).uid
    log.do(mc.DeleteQueue("dying"))
    log.do(mc.ReplicaDropped("n1", dying))
    log.do(mc.ReplicaDropped("n2", dying))
    assert _error(log.do(mc.SetNodeState("n3", "forgotten"))) is Conflict
    assert log.do(mc.SetNodeState("n3", "lost")) == Ok(True)
    reply = log.do(mc.SetNodeState("n3", "forgotten"))
    assert isinstance(reply, Rejected) and reply.error is Conflict
    assert "still holds replicas of 1 queues (live)" in reply.detail
    log.do(mc.AddNode("n4", "127.0.0.1:7004"))
    log.do(mc.AddMember(live, "n4", 1))
    log.do(mc.RemoveMember(live, "n3", 2))
    assert log.do(mc.SetNodeState("n3", "forgotten")) == Ok(True)
    assert log.machine.queues["dying"].state == "tombstone", "it waited for n3 alone"
    assert log.effects == [MetaChanged(log.index, nodes=("n3",), queues=("dying",))]
    assert _error(log.do(mc.SetNodeState("n3", "active"))) is Conflict
    assert log.do(mc.AddNode("n3", "127.0.0.1:7013")) == Ok(True)
    assert log.machine.nodes["n3"].joined_index == log.index


def test_a_node_records_its_data_directory_once_until_forgotten() -> None:
    log = Log()
    assert log.do(mc.NodeStarted("n1", "d1")) == Ok(True)
    assert log.machine.nodes["n1"].incarnation == "d1"
    assert log.do(mc.NodeStarted("n1", "d1")) == Ok(False)
    reply = log.do(mc.NodeStarted("n1", "d2"))
    assert isinstance(reply, Rejected) and reply.error is Conflict
    assert "another data directory" in reply.detail
    assert log.machine.nodes["n1"].incarnation == "d1"
    for bad, error in [
        (mc.NodeStarted("n9", "d9"), NotFound),
        (mc.NodeStarted("n2", ""), ValidationFailed),
    ]:
        reply = log.do(bad)
        assert isinstance(reply, Rejected) and reply.error is error
    # Forgotten, the name joins again as a new node, which reports its own directory.
    log.do(mc.SetNodeState("n1", "lost"))
    log.do(mc.SetNodeState("n1", "forgotten"))
    assert isinstance(log.do(mc.NodeStarted("n1", "d2")), Rejected)
    log.do(mc.AddNode("n1", "127.0.0.1:7001"))
    assert log.machine.nodes["n1"].incarnation == ""
    assert log.do(mc.NodeStarted("n1", "d2")) == Ok(True)
    # The snapshot keeps it.
    copy = MetaMachine(Limits())
    copy.restore(log.machine.snapshot())
    assert copy.nodes == log.machine.nodes


def test_a_policy_change_keeps_the_first_policy_for_replicas_created_later() -> None:
    log = Log()
    uid = log.create("q").uid
    changed = QueuePolicy(max_length=9)
    assert log.do(mc.SetQueuePolicy(uid, changed)) == Ok(True)
    rec = log.machine.queues["q"]
    assert rec.policy == changed and rec.first_policy == P and rec.created_policy == P
    assert log.do(mc.SetQueuePolicy(uid, QueuePolicy(max_length=3))) == Ok(True)
    assert log.machine.queues["q"].created_policy == P
    reply = log.do(mc.SetQueuePolicy(uid, QueuePolicy(priorities=3)))
    assert isinstance(reply, Rejected) and reply.error is ValidationFailed
    copy = MetaMachine(Limits())
    copy.restore(log.machine.snapshot())
    assert copy.queues == log.machine.queues
    # A snapshot from before the field existed restores without it.
    old = record_to_wire(dataclasses.replace(log.machine.queues["q"], first_policy=None))
    assert queue_from_wire(old[:-1]).first_policy is None


def test_a_known_node_at_another_address_is_refused() -> None:
    log = Log()
    assert log.do(mc.AddNode("n1", "127.0.0.1:7001")) == Ok(False)
    assert _error(log.do(mc.AddNode("n1", "10.0.0.9:7001"))) is Conflict


def test_at_the_node_limit_a_new_node_replaces_the_longest_forgotten() -> None:
    log = Log(Limits(cluster_nodes_max=3))
    assert _error(log.do(mc.AddNode("n4", "h:4"))) is ValidationFailed
    for name in ("n2", "n1"):
        log.do(mc.SetNodeState(name, "lost"))
        log.do(mc.SetNodeState(name, "forgotten"))
    assert log.do(mc.AddNode("n4", "h:4")) == Ok(True)
    assert sorted(log.machine.nodes) == ["n1", "n3", "n4"]


def test_users_tokens_and_permissions() -> None:
    log = Log()
    digest = "ab" * 32
    assert _error(log.do(mc.PutToken("t1", "ann", digest, "qra_abab", ""))) is NotFound
    assert log.do(mc.PutUser("ann", "$argon2id$h1", "user")) == Ok(True)
    assert log.do(mc.SetPermissions("ann", "", "orders", ".*")) == Ok(True)
    assert log.do(mc.PutUser("ann", "$argon2id$h2", "admin")) == Ok(True)
    user = log.machine.users["ann"]
    assert (user.password_hash, user.role, user.write, user.read) == (
        "$argon2id$h2",
        "admin",
        "orders",
        ".*",
    ), "a put keeps the permissions"
    assert log.do(mc.PutToken("t1", "ann", digest, "qra_abab", "ci")) == Ok(True)
    assert log.do(mc.PutToken("t1", "ann", digest, "qra_abab", "ci")) == Ok(False)
    assert _error(log.do(mc.PutToken("t2", "ann", digest, "qra_abab", ""))) is Conflict
    token = log.machine.token_by_digest(digest)
    assert token is not None and (token.id, token.user) == ("t1", "ann")
    assert log.do(mc.DeleteUser("ann")) == Ok(True)
    assert log.effects == [MetaChanged(log.index, users=("ann",), tokens=("t1",))]
    assert log.machine.token_by_digest(digest) is None and not log.machine.tokens


def test_a_refused_command_changes_nothing_but_the_applied_index() -> None:
    log = Log()
    log.create("orders")
    before = MetaMachine()
    before.restore(log.machine.snapshot())
    reply = log.do(mc.RemoveMember(log.machine.queues["orders"].uid, "n1", 7))
    assert isinstance(reply, Rejected) and log.effects == []
    assert log.machine.queues == before.queues and log.machine.nodes == before.nodes


def test_the_machine_checkpoints_once_its_log_outweighs_its_state() -> None:
    limits = Limits(meta_checkpoint_bytes_min=400, meta_record_bytes_estimate=10)
    log = Log(limits)
    asked: list[int] = []
    for n in range(60):
        log.do(mc.PutUser(f"u{n % 3}", f"hash{n}", "user"))
        if any(isinstance(e, CheckpointRequest) for e in log.effects):
            assert log.effects[-2:] == [CheckpointRequest(log.index), ReleaseCursor(log.index + 1)]
            asked.append(log.index)
    assert len(asked) >= 3 and asked[1] - asked[0] == asked[2] - asked[1]
    assert len(log.machine.live_indexes()) == 0


def test_beyond_the_limit_the_oldest_tombstones_are_forgotten() -> None:
    log = Log(Limits(cluster_tombstones_max=1))
    uids = []
    for name in ("a", "b"):
        uid = log.create(name, 1).uid
        uids.append(uid)
        log.do(mc.DeleteQueue(name))
        node = log.machine.queues[name].members[0]
        log.do(mc.ReplicaDropped(node, uid))
    assert sorted(log.machine.queues) == ["b"] and log.machine.queue_by_uid(uids[0]) is None
    assert log.effects == [MetaChanged(log.index, queues=("a", "b"))]


@pytest.mark.parametrize(
    "data", [b"", b"\x93\x01", b"\xc1", encode_command(mc.DeleteToken("t"))[:-1]]
)
def test_garbage_is_answered_not_raised(data: bytes) -> None:
    log = Log()
    reply, effects = log.machine.apply(ApplyMeta(log.index + 1, 1, 0), data)
    assert isinstance(reply, Rejected) and effects == []


def test_a_node_that_joined_later_takes_new_replicas_first_and_may_take_a_member() -> None:
    log = Log()
    log.create("a", replicas=3)
    log.create("b", replicas=2)
    assert log.do(mc.AddNode("n4", "127.0.0.1:7004")) == Ok(True)
    assert log.do(mc.AddNode("n4", "127.0.0.1:7004")) == Ok(False), "joining again: the same"
    assert _error(log.do(mc.AddNode("n4", "127.0.0.1:9"))) is Conflict
    # The least-loaded node is the newcomer: a new queue of one replica goes there.
    assert log.create("c", replicas=1).members == ("n4",)
    record = log.machine.queues["a"]
    moved = log.do(mc.AddMember(record.uid, "n4", record.generation))
    assert isinstance(moved, MembersChanged) and "n4" in moved.members
