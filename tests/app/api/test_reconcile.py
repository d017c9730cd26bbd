"""Start-up reconciliation: SQLite's queue definitions follow the engine (the source of
truth) after a crash between the two writes. In process, real Node and SQLite."""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx

from app.api.tokens import issue_token
from app.db import repo
from app.db.models import AuditEntry
from app.main import create_app
from app.settings import Settings


def _settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path / "data", admin_password="admin-password", node_name="n1")


def test_reconcile_after_crash_between_engine_and_sqlite(tmp_path: Path) -> None:
    async def first_life() -> None:
        app = create_app(_settings(tmp_path))
        async with app.router.lifespan_context(app):
            with app.state.db.transaction() as session:
                token, _ = issue_token(session, repo.get_user(session, "admin"), "")  # type: ignore[arg-type]
            transport = httpx.ASGITransport(app=app)
            headers = {"Authorization": f"Bearer {token}"}
            async with httpx.AsyncClient(
                transport=transport, base_url="http://t", headers=headers
            ) as client:
                for name in ("kept", "lost-row", "patched"):
                    assert (await client.put(f"/api/v1/queues/{name}")).status_code == 201
                assert (await client.post("/api/v1/queues/kept/snapshots")).status_code == 202
                patched = await client.patch("/api/v1/queues/patched", json={"max_length": 7})
                assert patched.status_code == 200
            # What a crash between the engine's write and SQLite's commit leaves behind:
            # a queue the engine has without its row, a row the engine never had (or
            # deleted), and a row that missed a policy change.
            with app.state.db.transaction() as session:
                repo.delete_queue(session, repo.get_queue(session, "lost-row"))  # type: ignore[arg-type]
                ghost = repo.create_queue(session, name="ghost", arguments={})
                repo.set_queue_status(session, ghost, "creating")
                row = repo.get_queue(session, "patched")
                assert row is not None and row.policies == {"max_length": 7}
                repo.set_queue_policies(session, row, {})

    async def second_life() -> None:
        app = create_app(_settings(tmp_path))
        async with app.router.lifespan_context(app):
            with app.state.db.transaction() as session:
                rows = {q.name: q for q in repo.list_queues(session)}
                assert sorted(rows) == ["kept", "lost-row", "patched"]
                assert all(q.status == "ready" for q in rows.values())
                assert rows["patched"].policies == {"max_length": 7}
                engine = {q.name: q.uid for q in app.state.node.queues()}
                assert {n: q.uid for n, q in rows.items()} == engine
                assert len(repo.list_snapshots(session, rows["kept"].uid)) == 1
                entry = session.query(AuditEntry).filter_by(action="queue.reconcile").one()
                assert entry.detail == {
                    "added": ["lost-row"],
                    "removed": ["ghost"],
                    "updated": ["patched"],
                }

    anyio.run(first_life)
    anyio.run(second_life)
