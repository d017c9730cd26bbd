"""Users, permissions, tokens and queue definitions of a cluster node: the metadata's,
mirrored into SQLite.

Rule: on a cluster node the cluster metadata (``engine.runtime.meta_group``) holds the
users, their permissions and the tokens' digests; SQLite stays the app's query store
(authentication reads it, as on a single node). Every applied ``MetaChanged`` naming
users or tokens is written into SQLite by one writer task, in order (rows upserted from
the records, deleted when the record is gone), marked ``replicated``; after a snapshot,
and once when the node's metadata replica first caught up, every row is rewritten
(``replicated`` rows the metadata no longer holds are deleted).

Queue definitions go the same way: a change naming a live queue writes its row from the
record (``queue_admin.mirror_definitions``: its arguments and policies, as a policy change
(``SetQueuePolicy``) or a create through another node left them), and a tombstoned
queue's row (of that incarnation) is deleted with its history. A full rewrite writes
every live queue's row; rows of queues the metadata no longer names at all are left to
the start-up reconcile (``queue_admin.reconcile``), which drops them.

A change made through the API goes to the metadata first (``commit``): the endpoint
returns once the change committed and this node's SQLite holds it, so that what it reads
next, and every other node once it applied the entry, sees it. Rows made on this node
alone (the bootstrap admin, ``quorra user add`` or ``token create`` before the first
start: not ``replicated``) are proposed to the metadata once caught up, unless it holds
that name already (then its record wins).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import anyio
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db import repo
from app.db.models import ApiToken, User
from app.db.session import Database
from app.problems import TokenNotFound, UserConflict, UserNotFound
from app.queue_admin import mirror_definitions
from engine.cluster import MetaChanged, QueueRecord, TokenRecord, UserRecord
from engine.cluster import meta_commands as mc
from engine.runtime.api import QueueInfo
from engine.runtime.reconciling import args_of

if TYPE_CHECKING:
    from engine.runtime.meta_group import MetaGroup

log = logging.getLogger("quorra.app")


@dataclass(frozen=True, slots=True)
class Rows:
    """What one write brings SQLite to: records by key (``None``: gone)."""

    index: int
    users: dict[str, UserRecord | None]
    tokens: dict[str, TokenRecord | None]
    full: bool
    queues: dict[str, QueueInfo] = field(default_factory=dict)
    """Live queues by name: their rows written from these."""
    dropped: dict[str, str] = field(default_factory=dict)
    """Tombstoned queues by name: the uid whose row goes."""


class ClusterMirror:
    """Keeps a cluster node's SQLite users and tokens equal to its metadata's."""

    def __init__(self, db: Database, group: MetaGroup) -> None:
        self.db = db
        self.group = group
        self.pending: asyncio.Queue[Rows] = asyncio.Queue()
        self.flushed_index = 0
        self.full_index = -1
        """The index of the last full rewrite queued; older changes are in it."""
        self.waiters: list[asyncio.Future[None]] = []
        self.task: asyncio.Task[None] | None = None
        self.adopted = asyncio.Event()
        """Set once the first full rewrite is written and this node's own rows proposed."""

    # --- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        self.group.listeners.append(self.on_change)
        self.task = asyncio.get_running_loop().create_task(self.run())

    async def stop(self) -> None:
        with contextlib.suppress(ValueError):
            self.group.listeners.remove(self.on_change)
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

    async def wait_adopted(self, timeout_s: float, given_up: asyncio.Event | None = None) -> bool:
        """Until this node's SQLite follows the metadata (at start: ``/readyz`` waits for
        it, so that the bootstrap admin mints tokens at once), at most ``timeout_s``, or
        until ``given_up`` is set."""
        waits = [asyncio.ensure_future(self.adopted.wait())]
        if given_up is not None:
            waits.append(asyncio.ensure_future(given_up.wait()))
        try:
            await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        return self.adopted.is_set()

    def on_change(self, change: MetaChanged | None) -> None:
        """On the loop, as the entry applies: the records as they are now."""
        machine = self.group.machine
        if change is None:
            self.queue_full()
        elif change.users or change.tokens or change.queues:
            users = {name: machine.users.get(name) for name in change.users}
            tokens = {tid: machine.tokens.get(tid) for tid in change.tokens}
            records = [machine.queues.get(name) for name in change.queues]
            queues, dropped = _queue_rows([r for r in records if r is not None])
            rows = Rows(change.index, users, tokens, False, queues, dropped)
            self.pending.put_nowait(rows)

    def queue_full(self) -> None:
        machine = self.group.machine
        index = self.group.applied_index
        self.full_index = index
        queues, dropped = _queue_rows(list(machine.queues.values()))
        rows = Rows(index, dict(machine.users), dict(machine.tokens), True, queues, dropped)
        self.pending.put_nowait(rows)

    async def run(self) -> None:
        """Rewrite everything once the metadata replica caught up, adopt this node's own
        rows, then write each change in order."""
        while not self.group.caught_up():
            await self.group.changed(1.0)
        self.queue_full()
        while True:
            rows = await self.pending.get()
            if rows.full or rows.index > self.full_index:
                try:
                    await anyio.to_thread.run_sync(write_rows, self.db, rows)
                except Exception:  # the next full rewrite repairs it; the node serves on
                    log.exception("cluster metadata: SQLite mirror write failed")
            self.flushed_index = max(self.flushed_index, rows.index)
            self.wake()
            if rows.full:
                await self.adopt_local_rows()
                self.adopted.set()

    def wake(self) -> None:
        for f in self.waiters:
            if not f.done():
                f.set_result(None)
        self.waiters.clear()

    async def wait_flushed(self, index: int) -> None:
        """Until SQLite holds what the metadata applied up to ``index`` (bounded)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.group.ctx.limits.leader_wait_ms / 1000
        while self.flushed_index < index and loop.time() < deadline:
            waiter: asyncio.Future[None] = loop.create_future()
            self.waiters.append(waiter)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiter, max(0.0, deadline - loop.time()))

    # --- changes through the metadata --------------------------------------------------

    async def commit(self, commands: list[mc.MetaCommand]) -> None:
        """Commit ``commands`` in order through the metadata, then wait for SQLite here."""
        for command in commands:
            await self.group.propose(command)
        await self.wait_flushed(self.group.applied_index)

    async def create_user(
        self, name: str, password_hash: str, role: str, configure: str, write: str, read: str
    ) -> None:
        if name in self.group.machine.users:
            raise UserConflict(f"user {name!r} exists")
        await self.commit(
            [mc.PutUser(name, password_hash, role), mc.SetPermissions(name, configure, write, read)]
        )

    async def update_user(
        self,
        name: str,
        password_hash: str | None,
        role: str | None,
        permissions: tuple[str, str, str] | None,
    ) -> None:
        rec = self.user(name)
        if role == "user" and rec.role == "admin":
            self.keep_an_admin(rec)
        commands: list[mc.MetaCommand] = []
        if password_hash is not None or (role is not None and role != rec.role):
            commands.append(mc.PutUser(name, password_hash or rec.password_hash, role or rec.role))
        if permissions is not None:
            commands.append(mc.SetPermissions(name, *permissions))
        await self.commit(commands)

    async def delete_user(self, name: str) -> None:
        self.keep_an_admin(self.user(name))
        await self.commit([mc.DeleteUser(name)])

    async def put_token(self, tid: str, user: str, digest: str, prefix: str, name: str) -> None:
        self.user(user)
        await self.commit([mc.PutToken(tid, user, digest, prefix, name)])

    async def delete_token(self, tid: str, who: str, is_admin: bool) -> TokenRecord:
        """Revoke token ``tid`` for user ``who`` (any user's for an admin); its record."""
        rec = self.group.machine.tokens.get(tid)
        if rec is None or (rec.user != who and not is_admin):
            raise TokenNotFound(f"no token {tid!r}")
        await self.commit([mc.DeleteToken(tid)])
        return rec

    def user(self, name: str) -> UserRecord:
        rec = self.group.machine.users.get(name)
        if rec is None:
            raise UserNotFound(f"no user {name!r}")
        return rec

    def keep_an_admin(self, rec: UserRecord) -> None:
        admins = sum(1 for u in self.group.machine.users.values() if u.role == "admin")
        if rec.role == "admin" and admins <= 1:
            raise UserConflict(f"{rec.name!r} is the last admin")

    async def adopt_local_rows(self) -> None:
        """Propose the rows made on this node alone that the metadata lacks."""
        users, tokens = await anyio.to_thread.run_sync(local_rows, self.db)
        machine = self.group.machine
        commands: list[mc.MetaCommand] = []
        for u in users:
            if u.name not in machine.users:
                role = "admin" if u.role == "admin" else "user"
                commands.append(mc.PutUser(u.name, u.password_hash, role))
                commands.append(mc.SetPermissions(u.name, u.configure, u.write, u.read))
        known = set(machine.users) | {u.name for u in users}
        for t in tokens:
            if t.id not in machine.tokens and t.user in known:
                commands.append(mc.PutToken(t.id, t.user, t.digest, t.prefix, t.name))
        if not commands:
            return
        try:
            await self.commit(commands)
        except Exception as e:  # the next full rewrite (a restart) tries again
            log.warning("cluster metadata: local users and tokens not adopted: %s", e)


def _queue_rows(records: list[QueueRecord]) -> tuple[dict[str, QueueInfo], dict[str, str]]:
    """The rows to write of ``records`` (live: as their record says) and to delete
    (tombstoned: that uid's); a queue being created or deleted keeps its row as it is."""
    live = {
        r.name: QueueInfo(r.name, r.uid, args_of(r), r.created_at_ms)
        for r in records
        if r.state == "live"
    }
    return live, {r.name: r.uid for r in records if r.state == "tombstone"}


@dataclass(frozen=True, slots=True)
class LocalUser:
    name: str
    password_hash: str
    role: str
    configure: str
    write: str
    read: str


@dataclass(frozen=True, slots=True)
class LocalToken:
    id: str
    user: str
    digest: str
    prefix: str
    name: str


def local_rows(db: Database) -> tuple[list[LocalUser], list[LocalToken]]:
    """The users and tokens of this node's SQLite that the metadata did not give it."""
    with db.transaction() as s:
        users = [
            LocalUser(u.name, u.password_hash, u.role, u.configure, u.write, u.read)
            for u in s.scalars(select(User).where(User.replicated.is_(False)).order_by(User.name))
        ]
        tokens = [
            LocalToken(t.id, t.user.name, t.digest, t.prefix, t.name)
            for t in s.scalars(
                select(ApiToken).where(ApiToken.replicated.is_(False)).order_by(ApiToken.id)
            )
        ]
    return users, tokens


def write_rows(db: Database, rows: Rows) -> None:
    """In a worker thread: SQLite made equal to ``rows`` (see the module's rule)."""
    with db.transaction() as s:
        for name in sorted(rows.users):
            _write_user(s, name, rows.users[name])
        s.flush()
        for tid in sorted(rows.tokens):
            _write_token(s, tid, rows.tokens[tid])
        if rows.full:
            for user in s.scalars(select(User).where(User.replicated.is_(True))):
                if user.name not in rows.users:
                    s.delete(user)
            for token in s.scalars(select(ApiToken).where(ApiToken.replicated.is_(True))):
                if token.id not in rows.tokens:
                    s.delete(token)
        for name, uid in sorted(rows.dropped.items()):
            row = repo.get_queue(s, name)
            if row is not None and row.uid == uid:
                repo.delete_queue(s, row)
        s.flush()
        mirror_definitions(s, [rows.queues[name] for name in sorted(rows.queues)])


def _write_user(s: Session, name: str, rec: UserRecord | None) -> None:
    row = repo.get_user(s, name)
    if rec is None:
        if row is not None and row.replicated:
            s.delete(row)
        return
    if row is None:
        row = User(name=name, password_hash=rec.password_hash, created_at=_at(rec.created_at_ms))
        s.add(row)
    elif row.password_hash != rec.password_hash:
        repo.set_password(s, row, rec.password_hash)  # ends the user's dashboard sessions
    fields = {
        "role": rec.role,
        "configure": rec.configure,
        "write": rec.write,
        "read": rec.read,
        "replicated": True,
    }
    for column, value in fields.items():
        if getattr(row, column) != value:
            setattr(row, column, value)


def _write_token(s: Session, tid: str, rec: TokenRecord | None) -> None:
    row = repo.get_token(s, tid)
    if rec is None:
        if row is not None and row.replicated:
            s.delete(row)
        return
    if row is not None:
        row.replicated = True
        return
    user = repo.get_user(s, rec.user)
    clash = repo.find_token(s, rec.digest)
    if user is None or clash is not None:
        return  # the user's row comes with it; a digest held by another id cannot be
    token = ApiToken(
        id=tid,
        user_id=user.id,
        digest=rec.digest,
        prefix=rec.prefix,
        name=rec.name,
        created_at=_at(rec.created_at_ms),
        replicated=True,
    )
    s.add(token)


def _at(epoch_ms: int) -> datetime:
    return datetime.fromtimestamp(epoch_ms / 1000, UTC)


__all__ = ["ClusterMirror", "Rows", "write_rows"]
