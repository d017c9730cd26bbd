"""The metadata tables (SQLite). Messages never go here.

Every change to these classes needs an Alembic revision in ``migrations/versions``; a
test compares the migrated schema with these models.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    TypeDecorator,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

ROLES = ("admin", "user")
SNAPSHOT_TRIGGERS = ("manual", "auto")
QUEUE_STATUSES = ("creating", "ready", "deleting")


def utcnow() -> datetime:
    return datetime.now(UTC)


class UtcDateTime(TypeDecorator[datetime]):
    """SQLite keeps no time zone: store UTC, hand back aware datetimes."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        assert value.tzinfo is not None, "naive datetimes are not stored"
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return None if value is None else value.replace(tzinfo=UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class User(Base):
    __tablename__ = "users"
    __table_args__ = (CheckConstraint("role IN ('admin', 'user')", name="role"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    password_hash: Mapped[str] = mapped_column(String(200))
    role: Mapped[str] = mapped_column(String(10), default="user")
    configure: Mapped[str] = mapped_column(String(500), default="")
    """Regular expression over queue names, matched in full (RabbitMQ style)."""
    write: Mapped[str] = mapped_column(String(500), default="")
    read: Mapped[str] = mapped_column(String(500), default="")
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow, onupdate=utcnow)
    replicated: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("0"))
    """Mirrored from the cluster metadata (a cluster node); False: made on this node alone."""

    tokens: Mapped[list[ApiToken]] = relationship(
        back_populates="user", cascade="all, delete-orphan", passive_deletes=True
    )


class ApiToken(Base):
    """A bearer token. Only the SHA-256 digest of the 256-bit secret is kept."""

    __tablename__ = "api_tokens"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    digest: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    """The first characters of the token, to tell tokens apart in lists."""
    name: Mapped[str] = mapped_column(String(200), default="")
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)
    replicated: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("0"))
    """Mirrored from the cluster metadata (a cluster node); False: made on this node alone."""

    user: Mapped[User] = relationship(back_populates="tokens")


class UiSession(Base):
    """A dashboard login. The cookie carries the signed id; logout deletes the row."""

    __tablename__ = "ui_sessions"

    digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    csrf_token: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UtcDateTime)

    user: Mapped[User] = relationship()


class QueueDefinition(Base):
    """A queue's declared arguments and its policies (overrides set by PATCH).

    ``uid`` names the queue's directory and Raft group; the user-given name never
    reaches the file system. ``status`` makes the two writes (SQLite, engine) safe
    across a crash: a row is ``creating`` until the engine confirmed the queue, and
    ``deleting`` until the engine dropped its data; start-up reconciles the rest.
    """

    __tablename__ = "queues"
    __table_args__ = (
        CheckConstraint("status IN ('creating', 'ready', 'deleting')", name="status"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    uid: Mapped[str] = mapped_column(String(32), unique=True)
    arguments: Mapped[dict[str, object]] = mapped_column(JSON, default=dict)
    policies: Mapped[dict[str, object]] = mapped_column(JSON, default=dict)
    status: Mapped[str] = mapped_column(String(10), default="creating")
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow, onupdate=utcnow)


class SnapshotEntry(Base):
    """A checkpoint of a queue (``engine.runtime.api.CheckpointRecord``)."""

    __tablename__ = "snapshots"
    __table_args__ = (
        CheckConstraint("trigger IN ('manual', 'auto')", name="trigger"),
        Index("ix_snapshots_queue_uid_taken_at", "queue_uid", "taken_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    queue_uid: Mapped[str] = mapped_column(ForeignKey("queues.uid", ondelete="CASCADE"))
    raft_index: Mapped[int] = mapped_column(BigInteger)
    term: Mapped[int] = mapped_column(BigInteger)
    taken_at: Mapped[datetime] = mapped_column(UtcDateTime)
    bytes: Mapped[int] = mapped_column(BigInteger)
    live_entries: Mapped[int] = mapped_column(BigInteger)
    trigger: Mapped[str] = mapped_column(String(10))
    duration_ms: Mapped[float] = mapped_column(Float)


class CompactionEntry(Base):
    """A finished compaction run (``engine.runtime.api.CompactionRecord``)."""

    __tablename__ = "compactions"
    __table_args__ = (
        CheckConstraint("trigger IN ('manual', 'auto')", name="trigger"),
        Index("ix_compactions_queue_uid_started_at", "queue_uid", "started_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    queue_uid: Mapped[str] = mapped_column(ForeignKey("queues.uid", ondelete="CASCADE"))
    phase: Mapped[str] = mapped_column(String(20))
    """``auto`` or the phases that ran, e.g. ``1,2``."""
    trigger: Mapped[str] = mapped_column(String(10))
    started_at: Mapped[datetime] = mapped_column(UtcDateTime)
    duration_ms: Mapped[float] = mapped_column(Float)
    segments_before: Mapped[int] = mapped_column(Integer)
    segments_after: Mapped[int] = mapped_column(Integer)
    bytes_before: Mapped[int] = mapped_column(BigInteger)
    bytes_after: Mapped[int] = mapped_column(BigInteger)
    live_entries: Mapped[int] = mapped_column(BigInteger)
    dead_entries_before: Mapped[int] = mapped_column(BigInteger)
    dead_entries_after: Mapped[int] = mapped_column(BigInteger)


class AuditEntry(Base):
    """An administrative action. ``actor`` is a name, so entries outlive deleted users."""

    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow, index=True)
    actor: Mapped[str] = mapped_column(String(100))
    action: Mapped[str] = mapped_column(String(50))
    target: Mapped[str] = mapped_column(String(250), default="")
    detail: Mapped[dict[str, object]] = mapped_column(JSON, default=dict)
    source: Mapped[str] = mapped_column(String(10))
    """Where the action came from: ``api``, ``ui``, ``cli`` or ``system``."""
    remote_addr: Mapped[str] = mapped_column(String(64), default="")


class NodeRecord(Base):
    """A Quorra process known to this node; ``is_local`` marks this process itself."""

    __tablename__ = "nodes"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    api_url: Mapped[str] = mapped_column(String(300))
    raft_address: Mapped[str | None] = mapped_column(String(300), nullable=True)
    is_local: Mapped[bool] = mapped_column(Boolean, default=False)
    first_seen_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    last_seen_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
