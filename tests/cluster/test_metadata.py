"""The cluster metadata group in real server processes: queue names unique cluster-wide,
creates and deletes through the metadata log, each node's reconcile loop following it,
users and tokens of every node the metadata's (issue 15, "Cluster metadata as a Raft
group")."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.app.test_ui import csrf_of, log_in
from tests.cluster.harness import Cluster

pytestmark = pytest.mark.integration

StartCluster = Callable[[int], Cluster]
META_DIR = "cluster-meta"
WAIT_S = 20.0
TOKEN_SHOWN = re.compile(r'<pre class="secret" id="new-token">([^<]+)</pre>')


def _replica_dirs(cluster: Cluster, node: str) -> set[str]:
    """The queue replicas a node holds on disk (their uids), the metadata's left out."""
    queues = Path(cluster.nodes[node].data_dir) / "queues"
    if not queues.exists():
        return set()
    return {p.name for p in queues.iterdir() if p.is_dir() and p.name != META_DIR}


def _wait(what: str, ready: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not ready():
        assert time.monotonic() < deadline, f"no {what} in {WAIT_S} s"
        time.sleep(0.1)


def _put(cluster: Cluster, via: str, name: str, **arguments: object) -> httpx.Response:
    """PUT the queue through ``via``, again while it answers 503 (no metadata leader yet)."""
    return _send(cluster, via, "PUT", f"/api/v1/queues/{name}", arguments)


def _send(
    cluster: Cluster, via: str, method: str, path: str, body: object = None
) -> httpx.Response:
    """The request, sent again while it answers 503 (a create and a delete through the
    metadata are idempotent: a retry after an unknown outcome is safe)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        response = cluster.client(via).request(method, path, json=body)
        if response.status_code != 503 or time.monotonic() > deadline:
            return response
        time.sleep(0.1)


def test_concurrent_creates_of_one_name_on_two_nodes_make_one_queue(
    start_cluster: StartCluster,
) -> None:
    cluster = start_cluster(3)
    for name in ("n1", "n2", "n3"):
        cluster.token(name)
    with ThreadPoolExecutor(2) as pool:
        same = list(pool.map(lambda via: _put(cluster, via, "twice", replicas=3), ["n1", "n2"]))
    assert sorted(r.status_code for r in same) == [200, 201], [r.text for r in same]
    _wait(
        "replica of twice on every node",
        lambda: all(_replica_dirs(cluster, n) for n in cluster.names),
    )
    uids = {name: _replica_dirs(cluster, name) for name in cluster.names}
    assert len(set().union(*uids.values())) == 1, uids
    with ThreadPoolExecutor(2) as pool:
        other = list(
            pool.map(
                lambda a: _put(cluster, a[0], "clash", replicas=2, max_length=a[1]),
                [("n2", 10), ("n3", 20)],
            )
        )
    assert sorted(r.status_code for r in other) == [201, 409], [r.text for r in other]
    # Every node, member or not, refuses the name with other arguments.
    assert _put(cluster, "n1", "clash", replicas=2, max_length=30).status_code == 409
    published = cluster.client("n3").post(
        "/api/v1/queues/twice/messages", json={"messages": [{"body": "one"}]}
    )
    assert published.status_code == 201, published.text


def test_a_member_down_during_a_delete_drops_the_queue_on_return(
    start_cluster: StartCluster,
) -> None:
    cluster = start_cluster(3)
    cluster.create_queue("doomed", replicas=3)
    _wait(
        "replica of doomed on every node",
        lambda: all(_replica_dirs(cluster, n) for n in cluster.names),
    )
    (uid,) = _replica_dirs(cluster, "n3")
    cluster.kill9("n3")
    deleted = _send(cluster, "n1", "DELETE", "/api/v1/queues/doomed")
    assert deleted.status_code == 204, deleted.text
    _wait(
        "doomed dropped on n1 and n2",
        lambda: not _replica_dirs(cluster, "n1") and not _replica_dirs(cluster, "n2"),
    )
    # Still deleting: the name is not free while n3 may hold a replica.
    assert _put(cluster, "n2", "doomed", replicas=3).status_code == 409
    assert uid in _replica_dirs(cluster, "n3")
    cluster.restart("n3")
    _wait("doomed dropped on n3", lambda: uid not in _replica_dirs(cluster, "n3"))
    # Every member reported its replica dropped: the name is free again, a new queue.
    _wait(
        "the name doomed free again",
        lambda: _put(cluster, "n3", "doomed", replicas=3).status_code == 201,
    )
    _wait(
        "the new doomed on every node",
        lambda: all(_replica_dirs(cluster, n) for n in cluster.names),
    )
    assert uid not in set().union(*(_replica_dirs(cluster, n) for n in cluster.names))


def test_users_and_tokens_made_on_one_node_work_on_every_node(
    start_cluster: StartCluster,
) -> None:
    cluster = start_cluster(3)
    # A token made on n1 (from the password: the bootstrap admin every node adopted).
    made = cluster.client("n1").post("/api/v1/tokens", json={"name": "t"})
    assert made.status_code == 201, made.text
    token = made.json()["token"]
    # Committed when answered; another node applies it once it hears of the commit
    # (its next append or heartbeat), so the token works there a moment later.
    for node in cluster.names:

        def works(node: str = node) -> bool:
            who = httpx.get(
                f"{cluster.url(node)}/api/v1/whoami",
                headers={"Authorization": f"Bearer {token}"},
            )
            assert who.status_code in (200, 401), (node, who.text)
            return who.status_code == 200

        _wait(f"the token on {node}", works)
    # A user made on n2 signs in on n3 and holds its permissions there.
    user = {"name": "app", "password": "app-password-1", "permissions": {"write": "orders.*"}}
    assert _send(cluster, "n2", "POST", "/api/v1/users", user).status_code == 201
    app_token = httpx.post(f"{cluster.url('n3')}/api/v1/tokens", auth=("app", "app-password-1"))
    assert app_token.status_code == 201, app_token.text
    shown = cluster.client("n1").get("/api/v1/users/app").json()
    assert shown["permissions"]["write"] == "orders.*"
    # Revoked on n3: refused on n1 once its cache forgets it (a second at most).
    revoked = _send(cluster, "n3", "DELETE", f"/api/v1/tokens/{made.json()['id']}")
    assert revoked.status_code == 204, revoked.text
    _wait(
        "the revoked token refused on n1",
        lambda: (
            httpx.get(
                f"{cluster.url('n1')}/api/v1/whoami", headers={"Authorization": f"Bearer {token}"}
            ).status_code
            == 401
        ),
    )
    # Deleted on n1: its password no longer signs in on n2.
    assert _send(cluster, "n1", "DELETE", "/api/v1/users/app").status_code == 204
    _wait(
        "the deleted user refused on n2",
        lambda: (
            httpx.post(
                f"{cluster.url('n2')}/api/v1/tokens", auth=("app", "app-password-1")
            ).status_code
            == 401
        ),
    )


def test_users_and_tokens_made_on_the_dashboard_work_on_every_node(
    start_cluster: StartCluster,
) -> None:
    cluster = start_cluster(2)
    with httpx.Client(base_url=cluster.url("n1"), timeout=10.0) as n1:
        assert log_in(n1).status_code == 303
        csrf = {"X-CSRF-Token": csrf_of(n1.get("/users"))}
        form = {"name": "ops", "password": "ops-password-1", "write": "jobs.*"}
        added = n1.post("/users", data=form, headers=csrf)
        assert added.status_code == 200 and "added" in added.text, added.text
        made = n1.post("/tokens", data={"user": "ops", "name": "ui"}, headers=csrf)
        assert made.status_code == 200, made.text
        token = TOKEN_SHOWN.search(made.text)
        assert token, made.text
        saved = n1.post("/users/ops/permissions", data={"read": "jobs.*"}, headers=csrf)
        assert saved.status_code == 200, saved.text
    bearer = {"Authorization": f"Bearer {token.group(1)}"}
    who = httpx.get(f"{cluster.url('n2')}/api/v1/whoami", headers=bearer)
    assert who.status_code == 200 and who.json()["name"] == "ops", who.text
    shown = cluster.client("n2").get("/api/v1/users/ops").json()["permissions"]
    assert shown == {"configure": "", "write": "", "read": "jobs.*"}
    token_id = cluster.client("n2").get("/api/v1/tokens", params={"user": "ops"}).json()[0]["id"]
    with httpx.Client(base_url=cluster.url("n2"), timeout=10.0) as n2:
        assert log_in(n2).status_code == 303
        csrf = {"X-CSRF-Token": csrf_of(n2.get("/users"))}
        revoked = n2.post(f"/tokens/{token_id}/revoke", headers=csrf)
        assert revoked.status_code == 200 and "revoked" in revoked.text, revoked.text
    _wait(
        "the token revoked on n2's dashboard refused on n1",
        lambda: httpx.get(f"{cluster.url('n1')}/api/v1/whoami", headers=bearer).status_code == 401,
    )
