"""create_app's lifespan in process: resource order, the engine seam, the schema."""

from __future__ import annotations

import gc
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from fastapi import FastAPI

from app.db import repo
from app.db.models import Base
from app.db.session import Database
from app.engine_seam import record_listener, store_record
from app.main import StartupReport, create_app
from app.settings import Settings
from engine.runtime.api import (
    CheckpointRecord,
    CompactionRecord,
    QueueArgs,
    QueueInfo,
    RecordListener,
)


@dataclass
class RecordingNode:
    """Stands in for engine.runtime.Node where only start/stop order matters."""

    app: FastAPI | None = None
    events: list[str] = field(default_factory=list)
    listener: RecordListener | None = None

    def set_record_listener(self, listener: RecordListener | None) -> None:
        self.events.append("listener")
        self.listener = listener

    async def start(self) -> None:
        assert self.app is not None
        state = self.app.state
        # Migrations ran and admin exists before the engine starts; not ready yet.
        assert (
            state.migrations == "0002" and not state.ready and state.engine_status == "recovering"
        )
        with state.db.transaction() as session:
            assert repo.get_user(session, "admin") is not None
        self.events.append("start")

    def queues(self) -> list[object]:
        return []  # the lifespan reconciles SQLite's queue definitions with these

    async def stop(self) -> None:
        assert self.app is not None
        assert not self.app.state.ready and self.app.state.node is None
        self.app.state.db.engine.connect().close()  # the database is still open
        self.events.append("stop")


def no_engine(settings: Settings) -> None:
    return None


def _settings(tmp_path: Path, password: str | None = None) -> Settings:
    return Settings(data_dir=tmp_path / "data", admin_password=password, node_name="n1")


def test_lifespan_orders_migrations_engine_ready_and_back(tmp_path: Path) -> None:
    node = RecordingNode()
    reports: list[StartupReport] = []
    app = create_app(_settings(tmp_path), node_factory=lambda s: node, announce=reports.append)  # type: ignore[arg-type,return-value]
    node.app = app

    async def run() -> None:
        async with app.router.lifespan_context(app):
            assert (
                app.state.ready
                and app.state.node is node
                and app.state.engine_status == "recovered"
            )
            node.events.append("serving")
        assert app.state.node is None and not app.state.ready

    anyio.run(run)
    assert node.events == ["listener", "start", "serving", "stop"]
    assert len(reports) == 1 and reports[0].admin_created and reports[0].admin_password
    assert (tmp_path / "data" / "secret.key").stat().st_mode & 0o777 == 0o600


def test_without_engine_the_app_is_ready_with_engine_absent(tmp_path: Path) -> None:
    app = create_app(_settings(tmp_path, password="fixed-password"), node_factory=lambda s: None)

    async def run() -> None:
        async with app.router.lifespan_context(app):
            assert (
                app.state.ready and app.state.node is None and app.state.engine_status == "absent"
            )

    anyio.run(run)


def test_start_up_state_is_frozen_out_of_the_collector_while_serving(tmp_path: Path) -> None:
    app = create_app(_settings(tmp_path, password="fixed-password"), node_factory=lambda s: None)
    frozen: list[int] = []

    async def run() -> None:
        async with app.router.lifespan_context(app):
            frozen.append(gc.get_freeze_count())

    anyio.run(run)
    assert frozen[0] > 0
    assert gc.get_freeze_count() == 0


def test_bootstrap_happens_once(tmp_path: Path) -> None:
    reports: list[StartupReport] = []
    for _ in range(2):
        app = create_app(
            _settings(tmp_path, password="fixed-password"),
            node_factory=no_engine,
            announce=reports.append,
        )

        async def run(app: FastAPI = app) -> None:
            async with app.router.lifespan_context(app):
                pass

        anyio.run(run)
    assert [(r.admin_created, r.admin_password) for r in reports] == [(True, None), (False, None)]


def test_migrated_schema_matches_the_models(tmp_path: Path) -> None:
    app = create_app(_settings(tmp_path, password="fixed-password"), node_factory=no_engine)

    async def run() -> None:
        async with app.router.lifespan_context(app):
            pass

    anyio.run(run)
    db = Database(f"sqlite:///{tmp_path / 'data' / 'meta.sqlite3'}")
    with db.engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        assert compare_metadata(context, Base.metadata) == []
    db.dispose()


@pytest.fixture
def db(tmp_path: Path) -> Database:
    app = create_app(_settings(tmp_path, password="fixed-password"), node_factory=no_engine)

    async def run() -> None:
        async with app.router.lifespan_context(app):
            pass

    anyio.run(run)
    database = Database(f"sqlite:///{tmp_path / 'data' / 'meta.sqlite3'}")
    yield database  # type: ignore[misc]
    database.dispose()


def test_engine_records_land_in_the_history_of_their_queue(db: Database) -> None:
    with db.transaction() as session:
        queue = repo.create_queue(session, name="orders", arguments={"priorities": 2}, uid="q0001")
        repo.set_queue_status(session, queue, "ready")
    checkpoint = CheckpointRecord("orders", 120, 3, 1_700_000_000_000, 4096, 17, "auto", 1.5)
    compaction = CompactionRecord(
        "orders", "1,2", "auto", 1_700_000_001_000, 8.0, 4, 2, 9000, 3000, 17, 80, 5
    )
    anyio.run(record_listener(db), checkpoint)
    assert store_record(db, compaction)
    assert not store_record(db, CheckpointRecord("nobody", 1, 1, 0, 1, 0, "manual", 0.1))
    with db.transaction() as session:
        [snap] = repo.list_snapshots(session, "q0001")
        assert (snap.raft_index, snap.term, snap.bytes, snap.live_entries, snap.trigger) == (
            120,
            3,
            4096,
            17,
            "auto",
        )
        assert snap.taken_at.timestamp() == 1_700_000_000
        [run] = repo.list_compactions(session, "q0001")
        assert (run.phase, run.bytes_before, run.bytes_after, run.dead_entries_after) == (
            "1,2",
            9000,
            3000,
            5,
        )
        repo.delete_queue(session, repo.get_queue(session, "orders"))  # type: ignore[arg-type]
    with db.transaction() as session:
        assert (
            repo.list_snapshots(session, "q0001") == []
            and repo.list_compactions(session, "q0001") == []
        )


def test_a_record_of_a_queue_sqlite_lacks_but_the_engine_lists_makes_its_row(db: Database) -> None:
    # A queue created through another node of a cluster: this node's engine leads it.
    info = QueueInfo("far", "u" * 32, QueueArgs(replicas=2), 9)
    record = CheckpointRecord("far", 5, 1, 1_700_000_000_000, 512, 2, "manual", 0.5)
    assert store_record(db, record, [info])
    with db.transaction() as session:
        row = repo.get_queue(session, "far")
        assert row is not None and row.uid == info.uid
        assert [s.raft_index for s in repo.list_snapshots(session, info.uid)] == [5]


def test_queue_definitions_round_trip(db: Database) -> None:
    with db.transaction() as session:
        queue = repo.create_queue(session, name="a.b-c", arguments={"max_length": 10})
        assert queue.status == "creating" and len(queue.uid) == 16
        repo.set_queue_policies(session, queue, {"message_ttl_ms": 1000})
        repo.set_queue_status(session, queue, "ready")
    with db.transaction() as session:
        [stored] = repo.list_queues(session, status="ready")
        assert (stored.name, stored.arguments, stored.policies) == (
            "a.b-c",
            {"max_length": 10},
            {"message_ttl_ms": 1000},
        )
        assert repo.get_queue_by_uid(session, stored.uid) is not None
        assert stored.created_at.tzinfo is not None


def test_a_node_that_started_is_stopped_when_start_up_fails_after_it(tmp_path: Path) -> None:
    class BrokenAfterStart(RecordingNode):
        def queues(self) -> list[object]:
            raise RuntimeError("reconciliation failed")

    node = BrokenAfterStart()
    app = create_app(_settings(tmp_path), node_factory=lambda s: node)  # type: ignore[arg-type,return-value]
    node.app = app

    async def run() -> None:
        async with app.router.lifespan_context(app):
            raise AssertionError("must not serve")

    with pytest.raises(RuntimeError, match="reconciliation failed"):
        anyio.run(run)
    assert node.events == ["listener", "start", "stop"]
    assert not app.state.ready and app.state.node is None
