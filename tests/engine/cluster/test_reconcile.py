"""Reconcile planning: running a plan (or any prefix of it, before a crash) and planning
again reaches the state the metadata asks for; a plan is idempotent; reports follow the
work they report; and with the real machine, every node's loop together finishes every
create and every delete."""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from engine.cluster import MetaMachine, encode_command
from engine.cluster import meta_commands as mc
from engine.cluster.reconcile import (
    BROKEN,
    MISSING,
    Action,
    CreateReplica,
    DeleteReplica,
    LeaveAlone,
    LocalState,
    ReportCreated,
    ReportDropped,
    after,
    plan,
    reports,
)
from engine.cluster.records import QueueRecord, QueueState
from engine.queue import QueuePolicy
from engine.raft.state_machine import ApplyMeta

NODES = ("n1", "n2", "n3")
ME = "n1"


@st.composite
def records(draw: st.DrawFn, uid: str) -> QueueRecord:
    members = tuple(sorted(draw(st.sets(st.sampled_from(NODES), min_size=1))))
    state = draw(st.sampled_from(["creating", "live", "deleting", "tombstone"]))
    created = tuple(sorted(draw(st.sets(st.sampled_from(members)))))
    dropped = (
        ()
        if state in ("creating", "live")
        else tuple(sorted(draw(st.sets(st.sampled_from(members)))))
    )
    bootstrap = tuple(sorted(draw(st.sets(st.sampled_from(NODES), min_size=1))))
    founders = tuple(n for n in bootstrap if draw(st.booleans()))
    return QueueRecord(
        name=f"q-{uid}",
        uid=uid,
        replicas=len(members),
        policy=QueuePolicy(),
        state=state,  # type: ignore[arg-type]
        members=members,
        leader=members[0],
        generation=1,
        bootstrap=bootstrap,
        founders=founders,
        created=created,
        dropped=dropped,
        created_at_ms=0,
        created_index=1,
    )


@st.composite
def situations(draw: st.DrawFn) -> tuple[dict[str, QueueRecord], dict[str, LocalState]]:
    uids = [f"u{k}" for k in range(8)]
    registry = {uid: draw(records(uid)) for uid in uids if draw(st.booleans())}
    local_states: st.SearchStrategy[LocalState] = st.sampled_from(["hosted", "hosted", "broken"])
    local = {uid: draw(local_states) for uid in uids if draw(st.booleans())}
    return registry, local


def desired(registry: dict[str, QueueRecord], local: dict[str, LocalState]) -> dict[str, str]:
    """What ``ME`` should hold once reconciled, stated directly."""
    want: dict[str, str] = {}
    for uid, rec in registry.items():
        if rec.state not in ("creating", "live") or ME not in rec.members:
            continue
        if uid in local:
            want[uid] = local[uid]
        elif ME not in rec.created:
            want[uid] = "hosted"
    return want


def _told(registry: dict[str, QueueRecord], actions: list[Action]) -> dict[str, QueueRecord]:
    """The registry once the reports are applied (as the machine would record them)."""
    out = dict(registry)
    for action in actions:
        rec = out.get(action.uid)
        if rec is None:
            continue
        if isinstance(action, ReportCreated):
            out[action.uid] = dataclasses.replace(rec, created=tuple(sorted({*rec.created, ME})))
        elif isinstance(action, ReportDropped):
            out[action.uid] = dataclasses.replace(rec, dropped=tuple(sorted({*rec.dropped, ME})))
    return out


@given(situations())
def test_running_the_plan_gives_the_desired_replicas(situation: Any) -> None:
    registry, local = situation
    actions = plan(ME, registry, local)
    assert after(local, actions) == desired(registry, local)


@given(situations(), st.data())
def test_a_crash_part_way_through_a_plan_converges_on_the_next(
    situation: Any, data: st.DataObject
) -> None:
    registry, local = situation
    actions = plan(ME, registry, local)
    done = data.draw(st.integers(0, len(actions)))
    crashed = after(local, actions[:done])
    assert after(crashed, plan(ME, registry, crashed)) == desired(registry, local)


def _recorded(rec: QueueRecord, report: ReportCreated | ReportDropped) -> bool:
    return ME in (rec.created if isinstance(report, ReportCreated) else rec.dropped)


@given(situations())
def test_a_plan_is_idempotent(situation: Any) -> None:
    registry, local = situation
    actions = plan(ME, registry, local)
    held = after(local, actions)
    again = plan(ME, registry, held)
    assert not [a for a in again if isinstance(a, CreateReplica | DeleteReplica)]
    due = [a for a in actions if isinstance(a, ReportCreated | ReportDropped)]
    due = [a for a in due if not _recorded(registry[a.uid], a)]
    assert [a for a in again if isinstance(a, ReportCreated | ReportDropped)] == due, (
        "reports stay due until the metadata records them"
    )
    quiet = plan(ME, _told(registry, actions), held)
    assert all(isinstance(a, LeaveAlone) for a in quiet), quiet


@given(situations())
def test_reports_follow_the_work_and_creates_say_how_to_start(situation: Any) -> None:
    registry, local = situation
    actions = plan(ME, registry, local)
    for k, action in enumerate(actions):
        if isinstance(action, CreateReplica):
            assert actions[k + 1] == ReportCreated(action.uid)
            rec = registry[action.uid]
            assert action.record == rec
            assert action.bootstrap == (rec.bootstrap if ME in rec.founders else ())
        if isinstance(action, DeleteReplica) and action.reason == "deleted":
            assert actions[k + 1] == ReportDropped(action.uid)
    uids = [a.uid for a in actions if not isinstance(a, ReportCreated | ReportDropped)]
    assert len(uids) == len(set(uids)), "one decision per replica"


def test_each_case_by_hand() -> None:
    def rec(
        uid: str, state: QueueState, created: tuple[str, ...] = (), members: tuple[str, ...] = NODES
    ) -> QueueRecord:
        return QueueRecord(
            uid, uid, 3, QueuePolicy(), state, members, "n1", 1, NODES, NODES, created, (), 0, 1
        )

    registry = {
        "new": rec("new", "creating"),
        "mine": rec("mine", "live", ("n1",)),
        "unreported": rec("unreported", "live"),
        "lost": rec("lost", "live", ("n1",)),
        "damaged": rec("damaged", "live"),
        "going": rec("going", "deleting"),
        "gone-here": rec("gone-here", "deleting"),
        "dead": rec("dead", "tombstone"),
        "moved": rec("moved", "live", (), ("n2", "n3")),
    }
    local: dict[str, LocalState] = {
        "mine": "hosted",
        "unreported": "hosted",
        "damaged": "broken",
        "going": "hosted",
        "dead": "hosted",
        "moved": "hosted",
        "stray": "hosted",
    }
    assert plan(ME, registry, local) == [
        LeaveAlone("damaged", BROKEN),
        DeleteReplica("dead", "orphan"),
        DeleteReplica("going", "deleted"),
        ReportDropped("going"),
        ReportDropped("gone-here"),
        LeaveAlone("lost", MISSING),
        DeleteReplica("moved", "orphan"),
        CreateReplica("new", registry["new"], NODES),
        ReportCreated("new"),
        DeleteReplica("stray", "orphan"),
        ReportCreated("unreported"),
    ]
    assert reports("n1", plan(ME, registry, local))[:2] == [
        mc.ReplicaDropped("n1", "going"),
        mc.ReplicaDropped("n1", "gone-here"),
    ]


# --- with the real machine --------------------------------------------------------------

ops = st.lists(
    st.tuples(
        st.sampled_from(["create", "create", "delete", "add", "remove", "reconcile"]),
        st.sampled_from(["a", "b", "c"]),
        st.sampled_from((*NODES, "n4")),
        st.integers(0, 5),
    ),
    max_size=30,
)


class Cluster:
    """A metadata machine and each node's replicas, driven by the reconcile loops."""

    def __init__(self) -> None:
        self.machine = MetaMachine()
        self.index = 0
        self.local: dict[str, dict[str, LocalState]] = {n: {} for n in (*NODES, "n4")}
        self.do(mc.Bootstrap("c"))
        for n in self.local:
            self.do(mc.AddNode(n, f"{n}:1"))

    def do(self, command: mc.MetaCommand) -> object:
        self.index += 1
        reply, _effects = self.machine.apply(ApplyMeta(self.index, 1, 0), encode_command(command))
        return reply

    def reconcile(self, node: str, steps: int | None = None) -> None:
        """One pass of ``node``'s loop; with ``steps``, a crash after that many actions."""
        actions = plan(node, self.machine.hosted_by(node), self.local[node])
        if steps is not None:
            actions = actions[:steps]
        self.local[node] = after(self.local[node], actions)
        for command in reports(node, actions):
            self.do(command)


@given(ops)
def test_every_nodes_loop_finishes_every_create_and_delete(script: list[Any]) -> None:
    c = Cluster()
    for op, name, node, n in script:
        q = c.machine.queues.get(name)
        if op == "create":
            c.do(mc.CreateQueue(name, 1 + n % 3, QueuePolicy()))
        elif op == "delete":
            c.do(mc.DeleteQueue(name))
        elif op in ("add", "remove") and q is not None:
            command = mc.AddMember if op == "add" else mc.RemoveMember
            c.do(command(q.uid, node, q.generation))
        elif op == "reconcile":
            c.reconcile(node, steps=n)  # crashes after n actions
    for _round in range(2):
        for node in c.local:
            c.reconcile(node)
    c.machine.check_invariants()
    for node, held in c.local.items():
        want = {uid for uid, q in c.machine.hosted_by(node).items() if q.state != "deleting"}
        assert set(held) == want, node
    for q in c.machine.queues.values():
        assert q.state in ("live", "tombstone"), q
