"""The repository: every query the app makes, as small functions over a ``Session``.

Functions never commit; the caller's transaction (the request, or
``Database.transaction()``) decides. Secrets arrive here already hashed.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session, joinedload

from app.db.models import (
    ApiToken,
    AuditEntry,
    CompactionEntry,
    NodeRecord,
    QueueDefinition,
    SnapshotEntry,
    UiSession,
    User,
    utcnow,
)
from engine.runtime.api import CheckpointRecord, CompactionRecord

TOKEN_TOUCH_INTERVAL = timedelta(minutes=1)
"""``last_used_at`` is written at most this often per token, not on every request."""
HISTORY_ROWS_MAX = 1000


# --- users ---------------------------------------------------------------------------


def get_user(session: Session, name: str) -> User | None:
    return session.scalar(select(User).where(User.name == name))


def get_user_by_id(session: Session, user_id: int) -> User | None:
    return session.get(User, user_id)


def list_users(session: Session) -> Sequence[User]:
    return session.scalars(select(User).order_by(User.name)).all()


def count_users(session: Session) -> int:
    return session.scalar(select(func.count()).select_from(User)) or 0


def count_admins(session: Session) -> int:
    return session.scalar(select(func.count()).select_from(User).where(User.role == "admin")) or 0


def create_user(
    session: Session,
    *,
    name: str,
    password_hash: str,
    role: str,
    configure: str,
    write: str,
    read: str,
) -> User:
    user = User(
        name=name,
        password_hash=password_hash,
        role=role,
        configure=configure,
        write=write,
        read=read,
    )
    session.add(user)
    session.flush()
    return user


def set_password(session: Session, user: User, password_hash: str) -> int:
    """Give ``user`` a new password and end their dashboard sessions (a password change
    is how one locks out whoever learnt the old one); returns how many ended."""
    user.password_hash = password_hash
    result = session.execute(delete(UiSession).where(UiSession.user_id == user.id))
    session.flush()
    return int(getattr(result, "rowcount", 0) or 0)


def replace_password_hash(session: Session, user_id: int, password_hash: str) -> None:
    """The same password under a new hash (new parameters); sessions stay."""
    user = session.get(User, user_id)
    if user is not None:
        user.password_hash = password_hash
        session.flush()


def delete_user(session: Session, user: User) -> None:
    session.delete(user)
    session.flush()


# --- API tokens ----------------------------------------------------------------------


def new_token_id() -> str:
    return secrets.token_hex(8)


def create_token(session: Session, *, user: User, digest: str, prefix: str, name: str) -> ApiToken:
    token = ApiToken(id=new_token_id(), user=user, digest=digest, prefix=prefix, name=name)
    session.add(token)
    session.flush()
    return token


def find_token(session: Session, digest: str) -> ApiToken | None:
    """The token and its user, in one query (this runs on every API request)."""
    query = select(ApiToken).options(joinedload(ApiToken.user)).where(ApiToken.digest == digest)
    return session.scalar(query)


def get_token(session: Session, token_id: str) -> ApiToken | None:
    return session.get(ApiToken, token_id)


def list_tokens(session: Session, user: User | None = None) -> Sequence[ApiToken]:
    query = select(ApiToken).order_by(ApiToken.created_at, ApiToken.id)
    if user is not None:
        query = query.where(ApiToken.user_id == user.id)
    return session.scalars(query).all()


def revoke_token(session: Session, token: ApiToken) -> None:
    session.delete(token)
    session.flush()


def token_use_is_stale(token: ApiToken, now: datetime | None = None) -> bool:
    """True when ``last_used_at`` is older than ``TOKEN_TOUCH_INTERVAL`` (or unset)."""
    now = now or utcnow()
    return token.last_used_at is None or now - token.last_used_at >= TOKEN_TOUCH_INTERVAL


def maybe_touch_token(token: ApiToken, now: datetime | None = None) -> bool:
    """Record use, at most once per ``TOKEN_TOUCH_INTERVAL``; says whether it wrote."""
    now = now or utcnow()
    if not token_use_is_stale(token, now):
        return False
    token.last_used_at = now
    return True


# --- dashboard sessions --------------------------------------------------------------


def create_ui_session(
    session: Session, *, user: User, digest: str, csrf_token: str, ttl: timedelta
) -> UiSession:
    row = UiSession(digest=digest, user=user, csrf_token=csrf_token, expires_at=utcnow() + ttl)
    session.add(row)
    session.flush()
    return row


def find_ui_session(session: Session, digest: str) -> UiSession | None:
    row = session.get(UiSession, digest)
    if row is None or row.expires_at <= utcnow():
        return None
    return row


def delete_ui_session(session: Session, digest: str) -> None:
    session.execute(delete(UiSession).where(UiSession.digest == digest))


def delete_expired_ui_sessions(session: Session) -> int:
    result = session.execute(delete(UiSession).where(UiSession.expires_at <= utcnow()))
    return int(getattr(result, "rowcount", 0) or 0)


# --- queue definitions ---------------------------------------------------------------


def new_queue_uid() -> str:
    return secrets.token_hex(8)


def get_queue(session: Session, name: str) -> QueueDefinition | None:
    return session.scalar(select(QueueDefinition).where(QueueDefinition.name == name))


def get_queue_by_uid(session: Session, uid: str) -> QueueDefinition | None:
    return session.scalar(select(QueueDefinition).where(QueueDefinition.uid == uid))


def list_queues(session: Session, status: str | None = None) -> Sequence[QueueDefinition]:
    query = select(QueueDefinition).order_by(QueueDefinition.name)
    if status is not None:
        query = query.where(QueueDefinition.status == status)
    return session.scalars(query).all()


def create_queue(
    session: Session, *, name: str, arguments: dict[str, object], uid: str | None = None
) -> QueueDefinition:
    """A new definition in status ``creating``; mark it ``ready`` once the engine has it."""
    queue = QueueDefinition(
        name=name, uid=uid or new_queue_uid(), arguments=arguments, policies={}, status="creating"
    )
    session.add(queue)
    session.flush()
    return queue


def set_queue_status(session: Session, queue: QueueDefinition, status: str) -> None:
    queue.status = status
    session.flush()


def set_queue_policies(
    session: Session, queue: QueueDefinition, policies: dict[str, object]
) -> None:
    # A new dict, so that SQLAlchemy sees the JSON column change.
    queue.policies = dict(policies)
    session.flush()


def delete_queue(session: Session, queue: QueueDefinition) -> None:
    """Remove the definition and, by cascade, its snapshot and compaction history."""
    session.delete(queue)
    session.flush()


# --- snapshot and compaction history -------------------------------------------------


@dataclass(frozen=True, slots=True)
class SnapshotFacts:
    raft_index: int
    term: int
    taken_at: datetime
    bytes: int
    live_entries: int
    trigger: str
    duration_ms: float


@dataclass(frozen=True, slots=True)
class CompactionFacts:
    phase: str
    trigger: str
    started_at: datetime
    duration_ms: float
    segments_before: int
    segments_after: int
    bytes_before: int
    bytes_after: int
    live_entries: int
    dead_entries_before: int
    dead_entries_after: int


def _from_ms(epoch_ms: int) -> datetime:
    return datetime.fromtimestamp(epoch_ms / 1000, tz=UTC)


def snapshot_facts(record: CheckpointRecord) -> SnapshotFacts:
    return SnapshotFacts(
        raft_index=record.index,
        term=record.term,
        taken_at=_from_ms(record.taken_at_ms),
        bytes=record.bytes,
        live_entries=record.live_entries,
        trigger=record.trigger,
        duration_ms=record.duration_ms,
    )


def compaction_facts(record: CompactionRecord) -> CompactionFacts:
    return CompactionFacts(
        phase=record.phase,
        trigger=record.trigger,
        started_at=_from_ms(record.started_at_ms),
        duration_ms=record.duration_ms,
        segments_before=record.segments_before,
        segments_after=record.segments_after,
        bytes_before=record.bytes_before,
        bytes_after=record.bytes_after,
        live_entries=record.live_entries,
        dead_entries_before=record.dead_entries_before,
        dead_entries_after=record.dead_entries_after,
    )


def _to_ms(at: datetime) -> int:
    return round(at.timestamp() * 1000)


def snapshot_record(name: str, row: SnapshotEntry) -> CheckpointRecord:
    """A stored checkpoint run as the engine reported it (to answer a peer with)."""
    return CheckpointRecord(
        queue=name,
        index=row.raft_index,
        term=row.term,
        taken_at_ms=_to_ms(row.taken_at),
        bytes=row.bytes,
        live_entries=row.live_entries,
        trigger="auto" if row.trigger == "auto" else "manual",
        duration_ms=row.duration_ms,
    )


def compaction_record(name: str, row: CompactionEntry) -> CompactionRecord:
    """A stored compaction run as the engine reported it (to answer a peer with)."""
    return CompactionRecord(
        queue=name,
        phase=row.phase,
        trigger="auto" if row.trigger == "auto" else "manual",
        started_at_ms=_to_ms(row.started_at),
        duration_ms=row.duration_ms,
        segments_before=row.segments_before,
        segments_after=row.segments_after,
        bytes_before=row.bytes_before,
        bytes_after=row.bytes_after,
        live_entries=row.live_entries,
        dead_entries_before=row.dead_entries_before,
        dead_entries_after=row.dead_entries_after,
    )


def record_snapshot(session: Session, queue_uid: str, facts: SnapshotFacts) -> SnapshotEntry:
    assert facts.trigger in ("manual", "auto")
    row = SnapshotEntry(queue_uid=queue_uid, **asdict(facts))
    session.add(row)
    session.flush()
    return row


def list_snapshots(
    session: Session, queue_uid: str, limit: int = HISTORY_ROWS_MAX
) -> Sequence[SnapshotEntry]:
    """Newest first."""
    query = (
        select(SnapshotEntry)
        .where(SnapshotEntry.queue_uid == queue_uid)
        .order_by(SnapshotEntry.taken_at.desc(), SnapshotEntry.id.desc())
        .limit(min(limit, HISTORY_ROWS_MAX))
    )
    return session.scalars(query).all()


def record_compaction(session: Session, queue_uid: str, facts: CompactionFacts) -> CompactionEntry:
    assert facts.trigger in ("manual", "auto")
    row = CompactionEntry(queue_uid=queue_uid, **asdict(facts))
    session.add(row)
    session.flush()
    return row


def list_compactions(
    session: Session, queue_uid: str, limit: int = HISTORY_ROWS_MAX
) -> Sequence[CompactionEntry]:
    """Newest first."""
    query = (
        select(CompactionEntry)
        .where(CompactionEntry.queue_uid == queue_uid)
        .order_by(CompactionEntry.started_at.desc(), CompactionEntry.id.desc())
        .limit(min(limit, HISTORY_ROWS_MAX))
    )
    return session.scalars(query).all()


# --- audit log -----------------------------------------------------------------------


def audit(
    session: Session,
    *,
    actor: str,
    action: str,
    target: str = "",
    detail: Mapping[str, object] | None = None,
    source: str = "api",
    remote_addr: str = "",
) -> AuditEntry:
    assert source in ("api", "ui", "cli", "system")
    entry = AuditEntry(
        actor=actor,
        action=action,
        target=target,
        detail=dict(detail or {}),
        source=source,
        remote_addr=remote_addr,
    )
    session.add(entry)
    session.flush()
    return entry


def list_audit(
    session: Session, limit: int = 100, before_id: int | None = None
) -> Sequence[AuditEntry]:
    query = select(AuditEntry).order_by(AuditEntry.id.desc()).limit(min(limit, HISTORY_ROWS_MAX))
    if before_id is not None:
        query = query.where(AuditEntry.id < before_id)
    return session.scalars(query).all()


# --- node registry -------------------------------------------------------------------


def register_local_node(session: Session, *, name: str, api_url: str) -> NodeRecord:
    """Record this process in the registry (once), refreshing its address and last sight."""
    for other in session.scalars(select(NodeRecord).where(NodeRecord.is_local)).all():
        if other.name != name:
            other.is_local = False
    node = session.get(NodeRecord, name)
    if node is None:
        node = NodeRecord(name=name, api_url=api_url, is_local=True)
        session.add(node)
    node.api_url = api_url
    node.is_local = True
    node.last_seen_at = utcnow()
    session.flush()
    return node
