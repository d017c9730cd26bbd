"""The REST API against a real server: tokens, users, permissions, problems, msgpack,
health, readiness and metrics."""

from __future__ import annotations

import secrets

import httpx
import msgpack
import pytest

from tests.app.conftest import ADMIN_PASSWORD, Server, make_token

pytestmark = pytest.mark.integration
PROBLEM = "application/problem+json"


def assert_problem(response: httpx.Response, status: int, problem: str) -> dict[str, object]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM
    body = response.json()
    assert body["type"] == f"/problems/{problem}"
    assert body["status"] == status
    assert isinstance(body["title"], str) and body["title"]
    assert "Traceback" not in response.text
    return dict(body)


def new_user(admin: httpx.Client, **permissions: str) -> tuple[str, str]:
    name, password = f"u-{secrets.token_hex(4)}", secrets.token_urlsafe(12)
    body = {"name": name, "password": password, "permissions": permissions}
    assert admin.post("/api/v1/users", json=body).status_code == 201
    return name, password


# --- tokens --------------------------------------------------------------------------


def test_token_from_basic_auth_is_shown_once_and_stored_hashed(
    server: Server, admin: httpx.Client
) -> None:
    created = httpx.post(
        f"{server.url}/api/v1/tokens", auth=("admin", ADMIN_PASSWORD), json={"name": "ci"}
    )
    assert created.status_code == 201
    assert created.headers["cache-control"] == "no-store"  # the secret stays out of caches
    body = created.json()
    assert set(body) == {"token", "id", "user", "name", "created_at"}
    assert body["token"].startswith("qra_") and len(body["token"]) >= 40
    assert body["user"] == "admin" and body["name"] == "ci"

    listed = {t["id"]: t for t in admin.get("/api/v1/tokens").json()}
    assert "token" not in listed[body["id"]]
    assert body["token"].startswith(listed[body["id"]]["prefix"])
    with server.client(body["token"]) as client:
        assert client.get("/api/v1/whoami").json()["token_id"] == body["id"]
    assert (server.data_dir / "meta.sqlite3").read_bytes().find(body["token"].encode()) == -1


def test_token_creation_refuses_bad_credentials(server: Server) -> None:
    url = f"{server.url}/api/v1/tokens"
    wrong = httpx.post(url, auth=("admin", "wrong-password"))
    assert_problem(wrong, 401, "unauthorized")
    assert wrong.headers["www-authenticate"].startswith("Basic")
    assert_problem(httpx.post(url, auth=("nobody", "whatever-pass")), 401, "unauthorized")
    assert_problem(httpx.post(url), 401, "unauthorized")
    assert_problem(httpx.post(url, headers={"Authorization": "Basic %%%"}), 401, "unauthorized")


def test_revoked_token_is_refused(server: Server, admin: httpx.Client) -> None:
    name, password = new_user(admin)
    token = make_token(server, name, password)
    with server.client(token) as client:
        assert client.get("/api/v1/whoami").json()["name"] == name
        token_id = client.get("/api/v1/whoami").json()["token_id"]
        assert [t["id"] for t in client.get("/api/v1/tokens").json()] == [token_id]
        assert client.delete(f"/api/v1/tokens/{token_id}").status_code == 204
        assert_problem(client.get("/api/v1/whoami"), 401, "unauthorized")


def test_users_manage_only_their_own_tokens(server: Server, admin: httpx.Client) -> None:
    name, password = new_user(admin)
    admin_token_id = admin.get("/api/v1/whoami").json()["token_id"]
    with server.client(make_token(server, name, password)) as client:
        assert_problem(client.delete(f"/api/v1/tokens/{admin_token_id}"), 404, "token-not-found")
        assert_problem(client.post("/api/v1/tokens", json={"user": "admin"}), 403, "forbidden")
        assert_problem(client.get("/api/v1/tokens", params={"user": "admin"}), 403, "forbidden")
    made_for = admin.post("/api/v1/tokens", json={"user": name, "name": "by-admin"})
    assert made_for.headers["cache-control"] == "no-store"
    assert made_for.status_code == 201 and made_for.json()["user"] == name
    assert {t["user"] for t in admin.get("/api/v1/tokens", params={"user": name}).json()} == {name}


# --- 401 and 403 ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer qra_not-a-token"},
        {"Authorization": "Bearer"},
        {"Authorization": "Token x"},
    ],
)
def test_api_needs_a_valid_bearer_token(server: Server, headers: dict[str, str]) -> None:
    response = httpx.get(f"{server.url}/api/v1/users", headers=headers)
    body = assert_problem(response, 401, "unauthorized")
    assert response.headers["www-authenticate"].startswith("Bearer")
    assert body["detail"]


def test_basic_auth_is_only_for_tokens(server: Server) -> None:
    response = httpx.get(f"{server.url}/api/v1/users", auth=("admin", ADMIN_PASSWORD))
    assert_problem(response, 401, "unauthorized")


def test_non_admins_cannot_manage_users(server: Server, admin: httpx.Client) -> None:
    name, password = new_user(admin, configure=".*", write=".*", read=".*")
    with server.client(make_token(server, name, password)) as client:
        assert_problem(client.get("/api/v1/users"), 403, "forbidden")
        body = {"name": "mallory", "password": "password123"}
        assert_problem(client.post("/api/v1/users", json=body), 403, "forbidden")
        assert_problem(
            client.patch(f"/api/v1/users/{name}", json={"role": "admin"}), 403, "forbidden"
        )
        assert_problem(client.get("/api/v1/audit"), 403, "forbidden")
        for verb in ("drain", "forget", "activate"):
            refused = client.post(f"/api/v1/cluster/nodes/node-1/{verb}")
            assert_problem(refused, 403, "forbidden")
        assert client.get("/api/v1/whoami").json()["role"] == "user"


def test_a_single_node_has_no_node_to_drain_forget_or_activate(admin: httpx.Client) -> None:
    for verb in ("drain", "forget", "activate"):
        refused = admin.post(f"/api/v1/cluster/nodes/node-1/{verb}")
        assert_problem(refused, 409, "single-node-cluster")
    node = admin.get("/api/v1/cluster").json()["nodes"][0]
    assert node["state"] == "active" and isinstance(node["replicas"], list)


# --- users and permissions -----------------------------------------------------------


def test_user_crud_and_permissions(server: Server, admin: httpx.Client) -> None:
    name = f"carol-{secrets.token_hex(3)}"
    created = admin.post(
        "/api/v1/users",
        json={"name": name, "password": "carol-password", "permissions": {"write": "orders\\..*"}},
    )
    assert created.status_code == 201
    assert created.json()["permissions"] == {"configure": "", "write": "orders\\..*", "read": ""}
    assert created.json()["role"] == "user"
    assert_problem(
        admin.post("/api/v1/users", json={"name": name, "password": "x" * 8}), 409, "user-conflict"
    )
    assert name in [u["name"] for u in admin.get("/api/v1/users").json()]

    perms = {"configure": "", "write": ".*", "read": "orders"}
    assert admin.put(f"/api/v1/users/{name}/permissions", json=perms).json() == perms
    assert admin.get(f"/api/v1/users/{name}/permissions").json() == perms
    patched = admin.patch(
        f"/api/v1/users/{name}", json={"role": "admin", "password": "new-password"}
    )
    assert patched.status_code == 200 and patched.json()["role"] == "admin"
    assert make_token(server, name, "new-password")
    assert_problem(
        httpx.post(f"{server.url}/api/v1/tokens", auth=(name, "carol-password")),
        401,
        "unauthorized",
    )

    assert admin.delete(f"/api/v1/users/{name}").status_code == 204
    assert_problem(admin.get(f"/api/v1/users/{name}"), 404, "user-not-found")
    assert_problem(admin.delete(f"/api/v1/users/{name}"), 404, "user-not-found")


def test_deleting_a_user_revokes_their_tokens(server: Server, admin: httpx.Client) -> None:
    name, password = new_user(admin)
    token = make_token(server, name, password)
    assert admin.delete(f"/api/v1/users/{name}").status_code == 204
    with server.client(token) as client:
        assert_problem(client.get("/api/v1/whoami"), 401, "unauthorized")


def test_the_last_admin_stays(admin: httpx.Client) -> None:
    assert_problem(admin.delete("/api/v1/users/admin"), 409, "user-conflict")
    assert_problem(admin.patch("/api/v1/users/admin", json={"role": "user"}), 409, "user-conflict")


@pytest.mark.parametrize(
    "body",
    [
        {"name": "bad name", "password": "password123"},
        {"name": "", "password": "password123"},
        {"name": "ok", "password": "short"},
        {"name": "ok", "password": "password123", "role": "root"},
        {"name": "ok", "password": "password123", "permissions": {"read": "(["}},
        {"name": "ok", "password": "password123", "surprise": 1},
        {"password": "password123"},
    ],
)
def test_user_validation_is_422_without_echoing_input(
    admin: httpx.Client, body: dict[str, object]
) -> None:
    response = admin.post("/api/v1/users", json=body)
    problem = assert_problem(response, 422, "validation-failed")
    assert isinstance(problem["errors"], list) and problem["errors"]
    assert "password123" not in response.text


def test_admin_actions_are_audited(admin: httpx.Client) -> None:
    name, _ = new_user(admin, read="x")
    admin.put(f"/api/v1/users/{name}/permissions", json={"read": "y"})
    admin.delete(f"/api/v1/users/{name}")
    entries = [
        e for e in admin.get("/api/v1/audit", params={"limit": 1000}).json() if e["target"] == name
    ]
    assert [e["action"] for e in entries] == ["user.delete", "user.permissions", "user.create"]
    assert all(
        e["actor"] == "admin" and e["source"] == "api" and e["remote_addr"] == "127.0.0.1"
        for e in entries
    )
    assert "password" not in str(entries)


# --- problems ------------------------------------------------------------------------


def test_malformed_json_is_400(admin: httpx.Client) -> None:
    response = admin.post(
        "/api/v1/users", content=b'{"name": ', headers={"Content-Type": "application/json"}
    )
    assert_problem(response, 400, "invalid-request")


def test_unknown_route_and_method(server: Server, admin: httpx.Client) -> None:
    assert_problem(httpx.get(f"{server.url}/no/such/page"), 404, "not-found")
    assert_problem(admin.get("/api/v1/nothing-here"), 404, "not-found")
    assert_problem(admin.put("/api/v1/audit"), 405, "method-not-allowed")
    not_allowed = admin.delete("/api/v1/users")
    assert_problem(not_allowed, 405, "method-not-allowed")
    assert not_allowed.headers["allow"] == "GET, POST"


def test_unsupported_media_type(admin: httpx.Client) -> None:
    response = admin.post(
        "/api/v1/users", content=b"name=x", headers={"Content-Type": "text/plain"}
    )
    assert_problem(response, 415, "unsupported-media-type")


def test_oversize_body_is_413_before_parsing(admin: httpx.Client) -> None:
    response = admin.post(
        "/api/v1/users",
        content=b"x" * (23 * 1024 * 1024),
        headers={"Content-Type": "application/json"},
    )
    assert_problem(response, 413, "message-too-large")


def test_oversize_chunked_body_is_413(admin: httpx.Client) -> None:
    def chunks() -> object:
        for _ in range(24):
            yield b"x" * (1024 * 1024)

    response = admin.post(
        "/api/v1/users", content=chunks(), headers={"Content-Type": "application/json"}
    )
    assert_problem(response, 413, "message-too-large")


# --- MessagePack ---------------------------------------------------------------------


def test_msgpack_request_and_response(admin: httpx.Client) -> None:
    name = f"mp-{secrets.token_hex(3)}"
    body = msgpack.packb({"name": name, "password": "msgpack-pass", "permissions": {"read": "q.*"}})
    created = admin.post(
        "/api/v1/users",
        content=body,
        headers={"Content-Type": "application/msgpack", "Accept": "application/msgpack"},
    )
    assert created.status_code == 201
    assert created.headers["content-type"] == "application/msgpack"
    assert msgpack.unpackb(created.content)["permissions"]["read"] == "q.*"
    as_json = admin.get(
        f"/api/v1/users/{name}", headers={"Accept": "application/msgpack;q=0.5, application/json"}
    )
    assert as_json.headers["content-type"] == "application/json"
    assert as_json.json()["name"] == name
    missing = admin.get("/api/v1/users/nobody-here", headers={"Accept": "application/msgpack"})
    assert_problem(missing, 404, "user-not-found")  # problems stay JSON


def test_malformed_msgpack_is_400_and_stores_nothing(admin: httpx.Client) -> None:
    before = len(admin.get("/api/v1/users").json())
    response = admin.post(
        "/api/v1/users",
        content=b"\x81\xa4name\xc1",
        headers={"Content-Type": "application/msgpack"},
    )
    body = assert_problem(response, 400, "invalid-request")
    assert "MessagePack" in str(body["detail"])
    invalid = msgpack.packb({"name": "x y", "password": "password1"})
    assert_problem(
        admin.post(
            "/api/v1/users", content=invalid, headers={"Content-Type": "application/msgpack"}
        ),
        422,
        "validation-failed",
    )
    assert len(admin.get("/api/v1/users").json()) == before


# --- operations ----------------------------------------------------------------------


def test_healthz_and_readyz_are_open(server: Server) -> None:
    assert httpx.get(f"{server.url}/healthz").json() == {"status": "ok"}
    ready = httpx.get(f"{server.url}/readyz")
    assert ready.status_code == 200
    body = ready.json()
    assert body["ready"] is True and body["migrations"] == "0002"
    assert body["engine"] in ("absent", "recovered")  # recovered once the runtime is built in


def test_metrics_need_a_token(server: Server, admin: httpx.Client, admin_token: str) -> None:
    assert_problem(httpx.get(f"{server.url}/metrics"), 401, "unauthorized")
    admin.get("/api/v1/whoami")
    response = admin.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    assert 'quorra_http_requests_total{method="GET",route="/api/v1/whoami",status="200"}' in text
    assert "quorra_ready 1.0" in text
    assert "quorra_http_request_duration_seconds_bucket" in text
    assert admin_token not in text


def test_openapi_document_lists_the_api(server: Server) -> None:
    doc = httpx.get(f"{server.url}/openapi.json").json()
    paths = doc["paths"]
    for path in (
        "/api/v1/users",
        "/api/v1/users/{user_name}",
        "/api/v1/tokens",
        "/api/v1/tokens/{token_id}",
        "/healthz",
        "/readyz",
        "/metrics",
    ):
        assert path in paths, path
    assert "/login" not in paths
    assert httpx.get(f"{server.url}/docs").status_code == 404
    assert set(doc["components"]["securitySchemes"]) == {"HTTPBearer", "HTTPBasic"}
    assert paths["/api/v1/users"]["get"]["security"] == [{"HTTPBearer": []}]
    assert {"HTTPBasic": []} in paths["/api/v1/tokens"]["post"]["security"]
    assert "security" not in paths["/healthz"]["get"]
    content = paths["/api/v1/users"]["post"]["requestBody"]["content"]
    assert set(content) >= {"application/json"}
