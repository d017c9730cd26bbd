"""The metadata machine against the plain model, over every command.

Two machines apply the same log (the same bytes at the same indexes); one of them is
replaced now and then by a fresh machine restored from its snapshot. After every step:
the replies and effects of both are equal, their snapshots are equal, a restored
snapshot encodes back to the same bytes, the records agree with the model, names are
unique, every queue's lifecycle moved along a legal transition, and ``MetaChanged``
names exactly the keys whose records changed.
"""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from engine.cluster import MetaMachine, encode_command
from engine.cluster import meta_commands as mc
from engine.cluster.replies import MetaChanged, Rejected
from engine.errors import InvalidRequest
from engine.limits import Limits
from engine.queue import QueuePolicy
from engine.raft.state_machine import ApplyMeta, CheckpointRequest, ReleaseCursor
from tests.engine.cluster.model import LIFECYCLE, Model, outcome

LIMITS = Limits(
    cluster_nodes_max=5,
    cluster_queues_max=4,
    cluster_tombstones_max=2,
    cluster_users_max=3,
    cluster_tokens_max=3,
    meta_checkpoint_bytes_min=600,
    meta_record_bytes_estimate=16,
)
NODES = ["n1", "n2", "n3", "n4", "n5", "n6"]
QUEUES = ["a", "b", "c"]
USERS = ["u1", "u2", "u3", "u4"]
POLICIES = [
    QueuePolicy(),
    QueuePolicy(max_length=10),
    QueuePolicy(priorities=2),
    QueuePolicy(lease_ms=0),  # invalid
]
DIGESTS = ["0" * 64, "1" * 64, "ab" * 32, "AB" * 32, "abc"]
BOGUS_UID = "f" * 32

nodes = st.sampled_from(NODES)
names = st.sampled_from(QUEUES)
users = st.sampled_from(USERS)
policies = st.sampled_from(POLICIES)
patterns = st.sampled_from(["", ".*", "a.*"])


class MetaMachineVsModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.a = MetaMachine(LIMITS)
        self.b = MetaMachine(LIMITS)
        self.model = Model(LIMITS)
        self.index = 0
        self.now = 1_000
        self.uids = [BOGUS_UID]
        self.states: dict[str, str] = {}
        """Uid -> the state it had after the last step."""
        self.gone: set[str] = set()
        """Uids whose tombstone was forgotten: they never come back."""

    # --- driving ---------------------------------------------------------------------

    def apply(self, command: mc.MetaCommand | bytes) -> Any:
        data = command if isinstance(command, bytes) else encode_command(command)
        if not isinstance(command, bytes):
            assert mc.decode_command(data) == command
        self.index += 1
        self.now += 7
        before = self._records(self.a)
        meta = ApplyMeta(self.index, 1, self.now)
        reply, effects = self.a.apply(meta, data)
        assert self.b.apply(meta, data) == (reply, effects)
        self._check_effects(effects, before, self._records(self.a))
        error = reply.error.__name__ if isinstance(reply, Rejected) else ""
        event(f"{type(command).__name__}: {outcome(reply)[0]} {error}")
        return reply

    def _check_effects(self, effects: list[Any], before: Any, after: Any) -> None:
        changed = [
            tuple(sorted(k for k in set(b) | set(a) if b.get(k) != a.get(k)))
            for b, a in zip(before, after, strict=True)
        ]
        told = [MetaChanged(self.index, *changed)] if any(changed) else []
        mine = [e for e in effects if isinstance(e, MetaChanged)]
        assert mine == told, (mine, told)
        rest = [e for e in effects if not isinstance(e, MetaChanged)]
        assert rest in ([], [CheckpointRequest(self.index), ReleaseCursor(self.index + 1)])

    @staticmethod
    def _records(m: MetaMachine) -> tuple[dict[str, Any], ...]:
        return dict(m.nodes), dict(m.queues), dict(m.users), dict(m.tokens)

    def _uid(self, data: st.DataObject) -> str:
        """Mostly a queue that is not a tombstone, else any uid ever seen (or a bogus one)."""
        alive = sorted(q.uid for q in self.model.queues.values() if q.state != "tombstone")
        if alive and data.draw(st.integers(0, 3)) > 0:
            return data.draw(st.sampled_from(alive))
        return data.draw(st.sampled_from(self.uids))

    def _node(self, data: st.DataObject, uid: str) -> str:
        """Mostly a member of queue ``uid``, else any node."""
        q = self.model.by_uid(uid)
        if q is not None and data.draw(st.integers(0, 3)):
            return data.draw(st.sampled_from(sorted(q.members)))
        return data.draw(nodes)

    def _generation(self, data: st.DataObject, uid: str) -> int:
        q = self.model.by_uid(uid)
        current = q.generation if q is not None else 1
        return data.draw(st.sampled_from([current, current, current - 1]))

    # --- rules -----------------------------------------------------------------------

    @initialize()
    def bootstrap(self) -> None:
        assert outcome(self.apply(mc.Bootstrap("c1"))) == ("ok", True)
        assert outcome(self.apply(mc.Bootstrap("c1"))) == ("ok", False)
        for name in NODES[:3]:
            expected = self.model.add_node(name, f"{name}:7000", self.index + 1)
            assert outcome(self.apply(mc.AddNode(name, f"{name}:7000"))) == expected

    @rule(name=nodes, other_address=st.booleans())
    def add_node(self, name: str, other_address: bool) -> None:
        address = "elsewhere:7000" if other_address else f"{name}:7000"
        expected = self.model.add_node(name, address, self.index + 1)
        assert outcome(self.apply(mc.AddNode(name, address))) == expected

    @rule(
        name=nodes,
        state=st.sampled_from(["active", "draining", "lost", "forgotten", "lost", "bogus"]),
    )
    def set_node_state(self, name: str, state: str) -> None:
        expected = self.model.set_node_state(name, state, self.index + 1)
        assert outcome(self.apply(mc.SetNodeState(name, state))) == expected

    @rule(
        name=names,
        replicas=st.one_of(st.integers(1, 3), st.integers(1, 3), st.integers(0, 4)),
        policy=st.one_of(st.just(POLICIES[0]), policies),
    )
    def create_queue(self, name: str, replicas: int, policy: QueuePolicy) -> None:
        expected = self.model.create(name, replicas, policy)
        reply = self.apply(mc.CreateQueue(name, replicas, policy))
        assert outcome(reply) == expected
        if expected == ("created",):
            assert reply.uid.startswith(f"{self.index:016x}") and len(reply.uid) == 32
            self.model.adopt_created(name, replicas, policy, reply)
            self.uids.append(reply.uid)

    @rule(data=st.data(), which=st.sampled_from(["", "current", "current", "other"]))
    def delete_queue(self, data: st.DataObject, which: str) -> None:
        q = self.model.by_uid(self._uid(data))
        name = q.name if q is not None else data.draw(names)
        uid = which if which == "" else (q.uid if q and which == "current" else BOGUS_UID)
        expected = self.model.delete(name, uid)
        assert outcome(self.apply(mc.DeleteQueue(name, uid))) == expected

    @rule(data=st.data())
    def replica_created(self, data: st.DataObject) -> None:
        uid = self._uid(data)
        node = self._node(data, uid)
        expected = self.model.replica_created(node, uid)
        assert outcome(self.apply(mc.ReplicaCreated(node, uid))) == expected

    @rule(data=st.data())
    def replica_dropped(self, data: st.DataObject) -> None:
        uid = self._uid(data)
        node = self._node(data, uid)
        expected = self.model.replica_dropped(node, uid)
        assert outcome(self.apply(mc.ReplicaDropped(node, uid))) == expected

    @rule(data=st.data(), node=nodes)
    def add_member(self, data: st.DataObject, node: str) -> None:
        uid = self._uid(data)
        generation = self._generation(data, uid)
        expected = self.model.add_member(uid, node, generation)
        assert outcome(self.apply(mc.AddMember(uid, node, generation))) == expected

    @rule(data=st.data())
    def remove_member(self, data: st.DataObject) -> None:
        uid = self._uid(data)
        node = self._node(data, uid)
        generation = self._generation(data, uid)
        expected = self.model.remove_member(uid, node, generation)
        reply = self.apply(mc.RemoveMember(uid, node, generation))
        assert outcome(reply) == expected
        if expected == ("members",):
            q = self.model.by_uid(uid)
            assert q is not None and set(reply.members) == q.members
            record = self.a.queue_by_uid(uid)
            assert record is not None and record.leader in q.members
            q.leader = record.leader

    @rule(data=st.data())
    def set_queue_leader(self, data: st.DataObject) -> None:
        uid = self._uid(data)
        node = self._node(data, uid)
        expected = self.model.set_leader(uid, node)
        assert outcome(self.apply(mc.SetQueueLeader(uid, node))) == expected

    @rule(data=st.data())
    def every_member_reports(self, data: st.DataObject) -> None:
        """Each member of one queue reports its replica created, or dropped when the
        queue is being deleted (what their reconcile loops do)."""
        uid = self._uid(data)
        q = self.model.by_uid(uid)
        if q is None:
            return
        for node in sorted(q.members):
            if q.state == "deleting":
                expected = self.model.replica_dropped(node, uid)
                assert outcome(self.apply(mc.ReplicaDropped(node, uid))) == expected
            else:
                expected = self.model.replica_created(node, uid)
                assert outcome(self.apply(mc.ReplicaCreated(node, uid))) == expected

    @rule(data=st.data(), policy=policies)
    def set_queue_policy(self, data: st.DataObject, policy: QueuePolicy) -> None:
        uid = self._uid(data)
        expected = self.model.set_policy(uid, policy)
        assert outcome(self.apply(mc.SetQueuePolicy(uid, policy))) == expected

    @rule(
        name=users,
        password_hash=st.sampled_from(["$argon2id$x", "$argon2id$y"]),
        role=st.sampled_from(["admin", "user", "root"]),
    )
    def put_user(self, name: str, password_hash: str, role: str) -> None:
        expected = self.model.put_user(name, password_hash, role)
        assert outcome(self.apply(mc.PutUser(name, password_hash, role))) == expected

    @rule(user=users, configure=patterns, write=patterns, read=patterns)
    def set_permissions(self, user: str, configure: str, write: str, read: str) -> None:
        expected = self.model.set_permissions(user, (configure, write, read))
        reply = self.apply(mc.SetPermissions(user, configure, write, read))
        assert outcome(reply) == expected

    @rule(name=users)
    def delete_user(self, name: str) -> None:
        assert outcome(self.apply(mc.DeleteUser(name))) == self.model.delete_user(name)

    @rule(
        token_id=st.sampled_from(["t1", "t2", "t3", "t4"]),
        user=users,
        digest=st.sampled_from(DIGESTS),
        label=st.sampled_from(["", "ci"]),
    )
    def put_token(self, token_id: str, user: str, digest: str, label: str) -> None:
        prefix = "qra_" + digest[:8]
        expected = self.model.put_token(token_id, (user, digest, prefix, label))
        reply = self.apply(mc.PutToken(token_id, user, digest, prefix, label))
        assert outcome(reply) == expected

    @rule(token_id=st.sampled_from(["t1", "t2", "t3", "t4"]))
    def delete_token(self, token_id: str) -> None:
        assert outcome(self.apply(mc.DeleteToken(token_id))) == self.model.delete_token(token_id)

    @rule(data=st.binary(max_size=40))
    def garbage(self, data: bytes) -> None:
        reply = self.apply(data)
        assert isinstance(reply, Rejected) and reply.error is InvalidRequest

    @rule()
    def restore_one_machine(self) -> None:
        snapshot = self.b.snapshot()
        fresh = MetaMachine(LIMITS)
        fresh.restore(snapshot)
        assert fresh.snapshot() == snapshot
        self.b = fresh

    # --- invariants ------------------------------------------------------------------

    @invariant()
    def machines_agree_with_each_other_and_the_model(self) -> None:
        a, model = self.a, self.model
        a.check_invariants()
        self.b.check_invariants()
        assert a.snapshot() == self.b.snapshot()
        assert set(a.queues) == set(model.queues)
        for name, q in model.queues.items():
            r = a.queues[name]
            got = (r.uid, r.state, set(r.members), set(r.created), set(r.dropped), r.generation)
            assert got == (q.uid, q.state, q.members, q.created, q.dropped, q.generation)
            assert (r.replicas, r.policy, r.leader) == (q.replicas, q.policy, q.leader)
        nodes = {n: [r.address, r.state, r.state_index] for n, r in a.nodes.items()}
        assert nodes == model.nodes
        got_users = {
            n: (u.password_hash, u.role, (u.configure, u.write, u.read)) for n, u in a.users.items()
        }
        assert got_users == model.users
        tokens = {i: (t.user, t.digest, t.prefix, t.name) for i, t in a.tokens.items()}
        assert tokens == model.tokens

    @invariant()
    def lifecycles_move_forward(self) -> None:
        now: dict[str, str] = {q.uid: q.state for q in self.a.queues.values()}
        for uid, state in now.items():
            event(f"a queue reached {state}")
            assert uid not in self.gone
            before = self.states.get(uid)
            assert (
                state == before
                or (before, state) in LIFECYCLE
                or (before, state)
                == (
                    None,
                    "creating",
                )
            ), (uid, before, state)
        for uid, before in self.states.items():
            if uid not in now:
                assert before == "tombstone", (uid, before)
                self.gone.add(uid)
                event("a tombstone was forgotten")
        self.states = now


TestMetaMachineVsModel = MetaMachineVsModel.TestCase
TestMetaMachineVsModel.settings = settings(
    max_examples=int(os.environ.get("QUORRA_META_EXAMPLES", "150")),
    stateful_step_count=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
