"""A cluster node's SQLite follows the metadata's users, tokens and queue definitions
(app/cluster_mirror.py): rows upserted and deleted by key, every row rewritten by a full
write, rows made on the node alone left to it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from app.cluster_mirror import ClusterMirror, Rows, local_rows, write_rows
from app.db import repo
from app.db.migrate import upgrade_to_head
from app.db.models import ApiToken, User
from app.db.session import Database
from app.settings import PROJECT_ROOT
from engine.cluster import TokenRecord, UserRecord
from engine.runtime import InMemoryNetwork
from engine.runtime.api import QueueArgs
from tests.engine.runtime.test_cluster import retrying
from tests.engine.runtime.test_meta_group import NAMES, cluster, group, stop_all
from tests.engine.runtime.util import eventually, run

NO_PERMS = {"configure": "", "write": "", "read": ""}


@pytest.fixture()
def db(tmp_path: Path) -> Iterator[Database]:
    database = Database(f"sqlite:///{tmp_path / 'meta.sqlite3'}")
    upgrade_to_head(database.engine, PROJECT_ROOT / "migrations")
    yield database
    database.dispose()


def _user(name: str, password_hash: str = "h1", role: str = "user", write: str = "") -> UserRecord:
    return UserRecord(name, password_hash, role, "", write, "", 1_700_000_000_000, 3)  # type: ignore[arg-type]


def _token(tid: str, user: str) -> TokenRecord:
    return TokenRecord(tid, user, tid * 4, "qra_" + tid[:4], "", 1_700_000_000_000)


def _state(db: Database) -> tuple[dict[str, tuple[str, str, bool]], dict[str, tuple[str, bool]]]:
    with db.transaction() as s:
        users = {u.name: (u.password_hash, u.write, u.replicated) for u in s.scalars(select(User))}
        tokens = {t.id: (t.user.name, t.replicated) for t in s.scalars(select(ApiToken))}
    return users, tokens


def test_changes_upsert_and_delete_by_key_and_leave_local_rows_alone(db: Database) -> None:
    with db.transaction() as s:
        local = repo.create_user(s, name="local", password_hash="lh", role="admin", **NO_PERMS)
        repo.create_token(s, user=local, digest="d" * 64, prefix="qra_dddd", name="")
    write_rows(
        db, Rows(5, {"app": _user("app", write="orders")}, {"aaaa": _token("aaaa", "app")}, False)
    )
    users, tokens = _state(db)
    assert users == {"local": ("lh", "", False), "app": ("h1", "orders", True)}
    assert tokens["aaaa"] == ("app", True)
    assert [u.name for u in local_rows(db)[0]] == ["local"]
    # A new hash and permissions; a token of an unknown user waits for its user's row.
    write_rows(
        db,
        Rows(6, {"app": _user("app", "h2", write="x")}, {"bbbb": _token("bbbb", "ghost")}, False),
    )
    users, tokens = _state(db)
    assert users["app"] == ("h2", "x", True) and "bbbb" not in tokens
    # Gone from the metadata: deleted here, its tokens with it; a local row is not.
    write_rows(db, Rows(7, {"app": None, "local": None}, {}, False))
    users, tokens = _state(db)
    assert set(users) == {"local"} and set(tokens) == {next(iter(tokens))}
    assert tokens[next(iter(tokens))] == ("local", False)


def test_a_full_write_rewrites_everything_and_adopts_local_rows_of_the_same_name(
    db: Database,
) -> None:
    with db.transaction() as s:
        repo.create_user(s, name="admin", password_hash="mine", role="admin", **NO_PERMS)
        repo.create_user(s, name="solo", password_hash="s", role="user", **NO_PERMS)
    write_rows(db, Rows(3, {"old": _user("old")}, {"cccc": _token("cccc", "old")}, False))
    full = Rows(
        9, {"admin": _user("admin", "theirs", "admin")}, {"eeee": _token("eeee", "admin")}, True
    )
    write_rows(db, full)
    users, tokens = _state(db)
    # "old" left the metadata while nothing told this node: the full write deletes it;
    # "admin" is the metadata's now (its hash, replicated); "solo" stays this node's.
    assert users == {"admin": ("theirs", "", True), "solo": ("s", "", False)}
    assert tokens == {"eeee": ("admin", True)}
    assert [u.name for u in local_rows(db)[0]] == ["solo"]


def _rows_of(db: Database) -> dict[str, tuple[str, dict[str, object], str]]:
    with db.transaction() as s:
        return {q.name: (q.uid, dict(q.policies), q.status) for q in repo.list_queues(s)}


def test_every_nodes_queue_row_follows_the_metadata(tmp_path: Path) -> None:
    """Three nodes in one process, each with its own SQLite and mirror: a queue created
    through one node gets a row on every node, a policy change through a node without a
    replica reaches every row once its ``SetQueuePolicy`` committed, and a deleted queue's
    rows go once every member dropped its replica."""

    async def body() -> None:
        network = InMemoryNetwork(NAMES)
        nodes = await cluster(tmp_path, network)
        dbs = {name: _database(tmp_path / f"{name}.sqlite3") for name in NAMES}
        mirrors = [ClusterMirror(dbs[n], group(nodes[n])) for n in NAMES]
        for mirror in mirrors:
            mirror.start()
        try:
            info, _ = await retrying(lambda: nodes["n1"].create_queue("p", QueueArgs(replicas=2)))
            await eventually(
                lambda: all(_rows_of(db).get("p", ("",))[0] == info.uid for db in dbs.values()),
                what="a row on every node",
            )
            assert all(_rows_of(db)["p"] == (info.uid, {}, "ready") for db in dbs.values())
            record = group(nodes["n1"]).machine.queues["p"]
            outsider = next(n for n in NAMES if n not in record.members)
            await retrying(lambda: nodes[outsider].update_policy("p", {"max_length": 7}))
            await eventually(
                lambda: all(
                    _rows_of(db)["p"] == (info.uid, {"max_length": 7}, "ready")
                    for db in dbs.values()
                ),
                what="every row with the policy",
            )
            await retrying(lambda: nodes[outsider].delete_queue("p"))
            await eventually(
                lambda: all("p" not in _rows_of(db) for db in dbs.values()), what="rows gone"
            )
        finally:
            for mirror in mirrors:
                await mirror.stop()
            await stop_all(nodes)
            for db in dbs.values():
                db.dispose()

    run(body())


def _database(path: Path) -> Database:
    database = Database(f"sqlite:///{path}")
    upgrade_to_head(database.engine, PROJECT_ROOT / "migrations")
    return database
