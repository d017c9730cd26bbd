"""Reconciling one node's replicas with the metadata: a pure plan of what to do.

Rule of this module: ``plan`` compares what the metadata says a node should host (the
records that name it a member) with the replicas it holds (uid -> local state) and lists
the actions that make them match, in the order to run them; running them, or any prefix
of them before a crash, and planning again converges. Every action is keyed by uid, and a
uid is never reused, so a plan made from a stale view is undone, never harmful, once the
view catches up:

* a creating or live queue the node should host and does not: create the replica, then
  report it created (the report waits for the create to be durable: run in order);
* a replica the node holds of a queue being deleted: delete it, then report it dropped;
  a queue being deleted that the node does not hold: report it dropped (it may have
  dropped it before a crash, or never created it);
* a replica of a queue the node should not host (no record, a tombstone, or a record
  that no longer names it: an orphan or a zombie): delete it;
* a replica the node reported created and no longer holds, or holds damaged: leave it
  alone and say why (re-creating it empty could let a member that lost its votes and
  log vote again; the operator replaces it instead).

The runtime should plan only once its metadata replica has applied what it learnt was
committed when it (re)started, not during the replay of its log: a stale plan is safe,
but it creates replicas that the next plan deletes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from engine.cluster.meta_commands import MetaCommand, ReplicaCreated, ReplicaDropped
from engine.cluster.records import QueueRecord

LocalState = Literal["hosted", "broken"]
"""``broken``: the replica's files are there but cannot be served (unreadable definition,
damaged beyond repair); it is kept for an operator unless the queue is gone."""


@dataclass(frozen=True, slots=True)
class CreateReplica:
    """Create the replica from ``record`` (its name, policy, members). With ``bootstrap``
    the replica starts a member of that configuration (the group's first one: this node
    founds the group); without, it starts with no configuration, neither votes nor
    campaigns, and waits for the group's leader to add it."""

    uid: str
    record: QueueRecord
    bootstrap: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class DeleteReplica:
    uid: str
    reason: str
    """``deleted`` (the queue is being deleted) or ``orphan`` (no queue places it here)."""


@dataclass(frozen=True, slots=True)
class ReportCreated:
    uid: str


@dataclass(frozen=True, slots=True)
class ReportDropped:
    uid: str


@dataclass(frozen=True, slots=True)
class LeaveAlone:
    uid: str
    reason: str


Action = CreateReplica | DeleteReplica | ReportCreated | ReportDropped | LeaveAlone

MISSING = "reported created and missing here: replace this member"
BROKEN = "damaged here: repair or replace this member"


def plan(
    node: str, registry: Mapping[str, QueueRecord], local: Mapping[str, LocalState]
) -> list[Action]:
    """The actions that make ``local`` match ``registry`` on ``node``. ``registry`` maps
    uids to records (``MetaMachine.hosted_by(node)``, or any larger map: records that do
    not name ``node`` a member count as absent)."""
    actions: list[Action] = []
    for uid in sorted(set(registry) | set(local)):
        rec = registry.get(uid)
        if rec is not None and (rec.state == "tombstone" or node not in rec.members):
            rec = None
        actions.extend(_plan_one(node, uid, rec, local.get(uid)))
    return actions


def _plan_one(
    node: str, uid: str, rec: QueueRecord | None, have: LocalState | None
) -> list[Action]:
    if rec is None:
        return [] if have is None else [DeleteReplica(uid, "orphan")]
    if rec.state == "deleting":
        if have is not None:
            return [DeleteReplica(uid, "deleted"), ReportDropped(uid)]
        return [] if node in rec.dropped else [ReportDropped(uid)]
    if have == "broken":
        return [LeaveAlone(uid, BROKEN)]
    if have == "hosted":
        return [] if node in rec.created else [ReportCreated(uid)]
    if node in rec.created:
        return [LeaveAlone(uid, MISSING)]
    bootstrap = rec.bootstrap if node in rec.founders else ()
    return [CreateReplica(uid, rec, bootstrap), ReportCreated(uid)]


def after(local: Mapping[str, LocalState], actions: Iterable[Action]) -> dict[str, LocalState]:
    """The replicas a node holds once ``actions`` ran (what the runtime's create and
    delete do to its disk, for the simulator and the tests)."""
    held = dict(local)
    for action in actions:
        if isinstance(action, CreateReplica):
            held[action.uid] = "hosted"
        elif isinstance(action, DeleteReplica):
            held.pop(action.uid, None)
    return held


def reports(node: str, actions: Iterable[Action]) -> list[MetaCommand]:
    """The metadata commands the report actions stand for, in order."""
    out: list[MetaCommand] = []
    for action in actions:
        if isinstance(action, ReportCreated):
            out.append(ReplicaCreated(node, action.uid))
        elif isinstance(action, ReportDropped):
            out.append(ReplicaDropped(node, action.uid))
    return out


__all__ = [
    "BROKEN",
    "MISSING",
    "Action",
    "CreateReplica",
    "DeleteReplica",
    "LeaveAlone",
    "LocalState",
    "ReportCreated",
    "ReportDropped",
    "after",
    "plan",
    "reports",
]
