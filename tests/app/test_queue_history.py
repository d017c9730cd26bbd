"""A queue's history as the API and the dashboard show it (app/queue_history.py): the
runs a node's SQLite keeps go back to a peer as the engine reported them; a node with a
replica shows its own (``local``), one without shows its leader's node's (``leader``),
or its own runs marked ``absent`` when the leader does not answer."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import anyio
import pytest

from app.db import repo
from app.db.migrate import upgrade_to_head
from app.db.session import Database
from app.queue_history import History, history_source, queue_history
from app.settings import PROJECT_ROOT
from engine.runtime.api import (
    CheckpointRecord,
    CompactionRecord,
    LeaderHistory,
    QueueEngine,
    QueueHistory,
)

CHECKPOINT = CheckpointRecord("q", 41, 3, 1_700_000_000_123, 2048, 17, "auto", 4.25)
COMPACTION = CompactionRecord(
    "q", "1,2", "manual", 1_700_000_001_456, 8.5, 4, 2, 900, 300, 17, 40, 3
)


@pytest.fixture()
def db(tmp_path: Path) -> Iterator[Database]:
    database = Database(f"sqlite:///{tmp_path / 'meta.sqlite3'}")
    upgrade_to_head(database.engine, PROJECT_ROOT / "migrations")
    with database.transaction() as s:
        row = repo.create_queue(s, name="q", arguments={}, uid="uid-q")
        repo.record_snapshot(s, row.uid, repo.snapshot_facts(CHECKPOINT))
        repo.record_compaction(s, row.uid, repo.compaction_facts(COMPACTION))
        older = repo.snapshot_facts(
            CheckpointRecord("q", 7, 1, 1_600_000_000_000, 1, 1, "manual", 1)
        )
        repo.record_snapshot(s, row.uid, older)
    yield database
    database.dispose()


class Asked:
    """Stands in for the node: ``leader_history`` answers what the test gives it."""

    def __init__(self, answer: LeaderHistory | None) -> None:
        self.answer = answer

    async def leader_history(self, name: str) -> LeaderHistory | None:
        return self.answer


def test_the_source_answers_stored_runs_as_the_engine_reported_them(db: Database) -> None:
    source = history_source(db)
    got = anyio.run(source, "q", "uid-q", 10)
    assert got.snapshots[0] == CHECKPOINT and got.compactions == [COMPACTION]
    assert [r.index for r in got.snapshots] == [41, 7]  # newest first
    assert anyio.run(source, "q", "uid-q", 1).snapshots == [CHECKPOINT]  # bounded
    # Another incarnation of the name (deleted and created again): none of these runs.
    assert anyio.run(source, "q", "uid-other", 10) == QueueHistory([], [])


def _shown(db: Database, answer: LeaderHistory | None) -> History:
    node: QueueEngine = Asked(answer)  # type: ignore[assignment]
    return anyio.run(queue_history, node, db, "q", "uid-q", "n3", 10)


def test_whose_runs_are_shown(db: Database) -> None:
    local = _shown(db, None)
    assert (local.source, local.node, local.detail) == ("local", "n3", "")
    assert [s.raft_index for s in local.snapshots] == [41, 7]
    assert local.snapshots[0].taken_at == datetime.fromtimestamp(1_700_000_000.123, UTC)

    theirs = QueueHistory([CheckpointRecord("q", 99, 4, 1_700_000_009_000, 5, 5, "auto", 1)], [])
    leader = _shown(db, LeaderHistory("ok", "n1", theirs))
    assert (leader.source, leader.node) == ("leader", "n1")
    assert [s.raft_index for s in leader.snapshots] == [99]
    assert leader.compactions == []

    why = "queue q: its leader did not answer within 2000 ms"
    absent = _shown(db, LeaderHistory("absent", "n1", QueueHistory([], []), why))
    assert (absent.source, absent.node, absent.detail) == ("absent", "n3", why)
    assert [s.raft_index for s in absent.snapshots] == [41, 7]
    assert [c.phase for c in absent.compactions] == ["1,2"]
