"""Queue administration shared by the REST API and the dashboard: every call goes to the
engine first, then mirrors into SQLite and lands in the audit log.

Source of truth
---------------
The engine's own durable records are the truth about which queues exist and with which
arguments; SQLite holds a mirror (for the dashboard, history and joins) that may lag
behind it after a crash between the two writes. So every change goes *engine first*,
then SQLite in a short transaction of its own:

* create: ``node.create_queue`` (idempotent), then the definition row, ``ready``;
* policy change: ``node.update_policy``, then the row's ``policies``;
* delete: ``node.delete_queue``, then the row (its history goes by cascade).

A crash (or a failed commit) after the engine call leaves SQLite behind, never ahead.
``reconcile`` runs at every start-up once the node has recovered, before the server
reports ready: rows whose queue the engine does not have (or has under another uid,
i.e. deleted and created again) are deleted with their history; queues the engine has
and SQLite lacks get a row; arguments are copied from the engine. A repeated ``PUT`` or
``DELETE`` also repairs its own row at once, since the engine calls are idempotent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TypeVar

import anyio
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from app.auth import Principal, require_flow
from app.db import repo
from app.db.models import QueueDefinition
from app.db.session import Database
from engine.errors import NoLeader, ValidationFailed
from engine.runtime.api import (
    CheckpointRecord,
    CompactionPhase,
    CompactionRecord,
    QueueArgs,
    QueueEngine,
    QueueInfo,
)

log = logging.getLogger("quorra.app")
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Actor:
    """Who asks, for the audit log."""

    name: str
    source: str = "api"
    remote_addr: str = ""


def _audit(session: Session, actor: Actor, action: str, target: str, **detail: object) -> None:
    repo.audit(
        session,
        actor=actor.name,
        action=action,
        target=target,
        detail=detail,
        source=actor.source,
        remote_addr=actor.remote_addr,
    )


def args_dict(args: QueueArgs) -> dict[str, object]:
    return asdict(args)


def check_dead_letter_target(who: Principal, name: str, target: str | None) -> None:
    """Setting ``target`` as ``name``'s dead-letter queue (on create, or a policy change
    that sets or changes it) makes ``name``'s messages flow there: beyond ``configure``
    on ``name`` (the caller's check), it needs ``read`` on ``name`` and ``write`` on
    ``target`` (403 otherwise), and another queue (422). The API and the dashboard both
    call this before changing anything."""
    if target is None:
        return
    if target == name:
        raise ValidationFailed("a queue cannot be its own dead_letter_queue")
    require_flow(who, name, target)


# --- the mirror --------------------------------------------------------------------


def mirror_definition(session: Session, info: QueueInfo) -> QueueDefinition:
    """Make the row of ``info.name`` agree with the engine; returns it (``ready``)."""
    return _mirror_row(session, info, repo.get_queue(session, info.name))


def _mirror_row(session: Session, info: QueueInfo, row: QueueDefinition | None) -> QueueDefinition:
    """``mirror_definition`` with the row of ``info.name`` already read (``None``: none)."""
    effective = args_dict(info.args)
    if row is not None and row.uid != info.uid:
        repo.delete_queue(session, row)  # a different incarnation: its history is gone
        row = None
    if row is None:
        row = repo.create_queue(session, name=info.name, arguments=effective, uid=info.uid)
    policies = {k: v for k, v in effective.items() if row.arguments.get(k, v) != v}
    if row.policies != policies:
        repo.set_queue_policies(session, row, policies)
    if row.status != "ready":
        repo.set_queue_status(session, row, "ready")
    return row


def mirror_definitions(session: Session, infos: list[QueueInfo]) -> None:
    """``mirror_definition`` of each of ``infos``, the rows read in one listing (a node's
    metadata may name 10,000 queues: a query each took seconds)."""
    rows = {row.name: row for row in repo.list_queues(session)} if len(infos) > 1 else {}
    for info in infos:
        row = rows[info.name] if info.name in rows else repo.get_queue(session, info.name)
        _mirror_row(session, info, row)


def forget_definition(session: Session, name: str) -> bool:
    row = repo.get_queue(session, name)
    if row is None:
        return False
    repo.delete_queue(session, row)
    return True


@dataclass(slots=True)
class ReconcileReport:
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.added or self.removed or self.updated)


def reconcile(db: Database, infos: list[QueueInfo]) -> ReconcileReport:
    """Make SQLite's queue definitions agree with the engine's queues (start-up)."""
    report = ReconcileReport()
    by_name = {info.name: info for info in infos}
    with db.transaction() as session:
        for row in list(repo.list_queues(session)):
            info = by_name.get(row.name)
            if info is None or info.uid != row.uid:
                repo.delete_queue(session, row)
                report.removed.append(row.name)
        # One listing, not a query per queue: 10,000 of them took seconds of a restart.
        rows = {row.name: row for row in repo.list_queues(session)}
        known = {name: (row.uid, dict(row.policies), row.status) for name, row in rows.items()}
        for name in sorted(by_name):
            row = _mirror_row(session, by_name[name], rows.get(name))
            if name not in known:
                report.added.append(name)
            elif known[name] != (row.uid, dict(row.policies), row.status):
                report.updated.append(name)
        if report.changed:
            _audit(
                session,
                Actor("system", "system"),
                "queue.reconcile",
                "",
                added=report.added,
                removed=report.removed,
                updated=report.updated,
            )
    return report


# --- administrative actions ------------------------------------------------------
#
# Each awaits the engine, then writes SQLite in a short transaction of its own on a
# worker thread: no SQLite lock is held while the engine works, and the event loop
# never waits on SQLite's busy timeout.


SQLITE_LOCKED_ATTEMPTS_MAX = 4
SQLITE_LOCKED_RETRY_S = 0.05
"""A write SQLite refused as locked is tried again in a new transaction, that many times
in all, after that pause times the attempt."""


async def _in_transaction(db: Database, work: Callable[[Session], _T]) -> _T:
    """``work`` in a transaction of its own on a worker thread. When many writers queue
    on SQLite's lock (16 clients creating queues while the server is busy) one may wait
    out the busy timeout (SQLite polls the lock, it does not queue its waiters): the
    engine already made the change, so the mirror and audit are written again rather
    than answered 500. ``work`` here is database work only, safe to run again."""
    for attempt in range(1, SQLITE_LOCKED_ATTEMPTS_MAX + 1):
        try:
            return await db.run(work)
        except OperationalError as e:
            if "database is locked" not in str(e) or attempt == SQLITE_LOCKED_ATTEMPTS_MAX:
                raise
            log.warning("SQLite locked (attempt %d), the transaction runs again", attempt)
        await anyio.sleep(SQLITE_LOCKED_RETRY_S * attempt)
    raise AssertionError("unreachable: the last attempt returns or raises")


async def create_queue(
    node: QueueEngine, db: Database, actor: Actor, name: str, args: QueueArgs
) -> tuple[QueueInfo, bool]:
    """Create (or find the same) queue; ``QueueConflict`` when it exists with other args."""
    info, created = await node.create_queue(name, args)

    def mirror(session: Session) -> None:
        mirror_definition(session, info)
        if created:
            _audit(session, actor, "queue.create", name, arguments=args_dict(args))

    await _in_transaction(db, mirror)
    return info, created


async def update_policy(
    node: QueueEngine, db: Database, actor: Actor, name: str, changes: dict[str, object]
) -> QueueInfo:
    info = await node.update_policy(name, changes)

    def mirror(session: Session) -> None:
        mirror_definition(session, info)
        _audit(session, actor, "queue.policy", name, changes=changes)

    await _in_transaction(db, mirror)
    return info


async def delete_queue(node: QueueEngine, db: Database, actor: Actor, name: str) -> None:
    await node.delete_queue(name)

    def forget(session: Session) -> None:
        forget_definition(session, name)
        _audit(session, actor, "queue.delete", name)

    await _in_transaction(db, forget)


async def purge_queue(node: QueueEngine, db: Database, actor: Actor, name: str) -> int:
    purged = await node.purge(name)
    await _in_transaction(
        db, lambda session: _audit(session, actor, "queue.purge", name, purged=purged)
    )
    return purged


async def record_action(
    db: Database, actor: Actor, action: str, name: str, **detail: object
) -> None:
    """Audit an action the caller already performed on the engine."""
    await _in_transaction(db, lambda session: _audit(session, actor, action, name, **detail))


def _ensure_row(session: Session, node: _Listed, name: str) -> QueueDefinition:
    row = repo.get_queue(session, name)
    if row is None:
        info = next((q for q in node.queues() if q.name == name), None)
        assert info is not None, f"the engine answered for {name!r} but does not list it"
        row = mirror_definition(session, info)
    return row


CHECKPOINT_RETRY_S = 0.05
CHECKPOINT_WAIT_S_MAX = 2.0
"""A queue created a moment ago has applied nothing yet (the engine says ``NoLeader``,
retry): a manual checkpoint waits that long for its first entry before giving up."""


async def take_checkpoint(
    node: QueueEngine, db: Database, actor: Actor, name: str
) -> CheckpointRecord:
    waited_s = 0.0
    while True:
        try:
            record = await node.checkpoint(name, trigger="manual")
            break
        except NoLeader:
            if waited_s >= CHECKPOINT_WAIT_S_MAX:
                raise
            await anyio.sleep(CHECKPOINT_RETRY_S)
            waited_s += CHECKPOINT_RETRY_S
    names = node.queues()

    def store(session: Session) -> None:
        row = _ensure_row(session, _Listed(names), name)
        repo.record_snapshot(session, row.uid, repo.snapshot_facts(record))
        _audit(session, actor, "queue.snapshot", name, index=record.index, bytes=record.bytes)

    await _in_transaction(db, store)
    return record


async def run_compaction(
    node: QueueEngine, db: Database, actor: Actor, name: str, phase: CompactionPhase
) -> CompactionRecord:
    record = await node.compact(name, phase=phase, trigger="manual")
    names = node.queues()

    def store(session: Session) -> None:
        row = _ensure_row(session, _Listed(names), name)
        repo.record_compaction(session, row.uid, repo.compaction_facts(record))
        _audit(
            session,
            actor,
            "queue.compact",
            name,
            phase=str(phase),
            ran=record.phase,
            bytes_before=record.bytes_before,
            bytes_after=record.bytes_after,
        )

    await _in_transaction(db, store)
    return record


@dataclass(frozen=True, slots=True)
class _Listed:
    """The engine's queue list, taken on the event loop for use on a worker thread."""

    infos: list[QueueInfo]

    def queues(self) -> list[QueueInfo]:
        return self.infos


__all__ = [
    "Actor",
    "ReconcileReport",
    "check_dead_letter_target",
    "create_queue",
    "delete_queue",
    "forget_definition",
    "mirror_definition",
    "mirror_definitions",
    "purge_queue",
    "reconcile",
    "record_action",
    "run_compaction",
    "take_checkpoint",
    "update_policy",
]
