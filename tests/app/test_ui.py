"""Dashboard login, logout and CSRF against a real server."""

from __future__ import annotations

import re
import secrets

import httpx
import pytest

from tests.app.conftest import ADMIN_PASSWORD, Server

pytestmark = pytest.mark.integration
CSRF_INPUT = re.compile(r'name="csrf_token" value="([^"]+)"')


def csrf_of(page: httpx.Response) -> str:
    match = CSRF_INPUT.search(page.text)
    assert match, page.text
    return match.group(1)


def browser(server: Server) -> httpx.Client:
    return httpx.Client(base_url=server.url, timeout=10.0, follow_redirects=False)


def log_in(
    client: httpx.Client, password: str = ADMIN_PASSWORD, user: str = "admin"
) -> httpx.Response:
    token = csrf_of(client.get("/login"))
    return client.post("/login", data={"username": user, "password": password, "csrf_token": token})


def test_pages_need_a_login(server: Server) -> None:
    with browser(server) as client:
        response = client.get("/")
        assert response.status_code == 303 and response.headers["location"] == "/login"


def test_login_page_is_open_and_pairs_csrf_with_a_strict_cookie(server: Server) -> None:
    with browser(server) as client:
        page = client.get("/login")
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        assert '<script src="/static/vendor/htmx.min.js"' in page.text
        assert '<link rel="stylesheet" href="/static/app.css">' in page.text
        cookie = page.headers["set-cookie"].lower()
        assert (
            "quorra_login_csrf=" in cookie and "httponly" in cookie and "samesite=strict" in cookie
        )
        assert csrf_of(page)
        assert client.get("/static/app.css").status_code == 200


def test_login_refuses_a_missing_or_foreign_csrf_token(server: Server) -> None:
    with browser(server) as client:
        client.get("/login")
        no_token = client.post("/login", data={"username": "admin", "password": ADMIN_PASSWORD})
        assert no_token.status_code == 403 and "quorra_session" not in no_token.headers.get(
            "set-cookie", ""
        )
        forged = client.post(
            "/login", data={"username": "admin", "password": ADMIN_PASSWORD, "csrf_token": "forged"}
        )
        assert forged.status_code == 403
    with browser(server) as other:  # a token without its cookie is worthless
        token = csrf_of(httpx.get(f"{server.url}/login"))
        stolen = other.post(
            "/login", data={"username": "admin", "password": ADMIN_PASSWORD, "csrf_token": token}
        )
        assert stolen.status_code == 403


def test_wrong_password_is_refused(server: Server) -> None:
    with browser(server) as client:
        response = log_in(client, password="not-the-password")
        assert response.status_code == 401 and "Wrong user name or password" in response.text
        assert "quorra_session" not in client.cookies


def test_login_landing_page_and_logout(server: Server) -> None:
    with browser(server) as client:
        response = log_in(client)
        assert response.status_code == 303 and response.headers["location"] == "/"
        cookie = response.headers["set-cookie"]
        session_cookie = next(
            c for c in response.headers.get_list("set-cookie") if c.startswith("quorra_session=")
        )
        assert "HttpOnly" in session_cookie and "SameSite=strict" in session_cookie, cookie
        home = client.get("/")
        assert home.status_code == 200
        assert "admin" in home.text and "Sign out" in home.text and "Queue engine" in home.text
        assert home.headers["cache-control"] == "no-store"
        assert home.headers["x-frame-options"] == "DENY"
        csrf = csrf_of(home)
        assert f'"X-CSRF-Token": "{csrf}"' in home.text  # htmx sends it on every request
        assert client.get("/login").status_code == 303  # already logged in

        refused = client.post("/logout", data={"csrf_token": "wrong"})
        assert refused.status_code == 403
        assert client.get("/").status_code == 200  # still logged in

        stolen_cookie = client.cookies["quorra_session"]
        out = client.post("/logout", data={"csrf_token": csrf})
        assert out.status_code == 303 and out.headers["location"] == "/login"
        assert client.get("/").status_code == 303
    # The server forgot the session: replaying the old cookie does not log in.
    with browser(server) as replay:
        replay.cookies.set("quorra_session", stolen_cookie)
        assert replay.get("/").status_code == 303


def test_csrf_header_works_for_htmx(server: Server) -> None:
    with browser(server) as client:
        log_in(client)
        csrf = csrf_of(client.get("/"))
        response = client.post("/logout", headers={"X-CSRF-Token": csrf})
        assert response.status_code == 303 and client.get("/").status_code == 303


def test_tampered_session_cookie_is_ignored(server: Server) -> None:
    with browser(server) as client:
        log_in(client)
        value = client.cookies["quorra_session"]
        client.cookies.set(
            "quorra_session", value[:-2] + ("AA" if not value.endswith("AA") else "BB")
        )
        assert client.get("/").status_code == 303


def test_logins_are_audited(server: Server, admin: httpx.Client) -> None:
    with browser(server) as client:
        log_in(client)
        client.post("/logout", headers={"X-CSRF-Token": csrf_of(client.get("/"))})
    actions = [e["action"] for e in admin.get("/api/v1/audit").json() if e["source"] == "ui"]
    assert actions[:2] == ["session.logout", "session.login"]


def test_a_new_password_ends_the_users_sessions(server: Server, admin: httpx.Client) -> None:
    """Issue 13: whoever learnt the old password stayed logged in after the change."""
    name, old_password = f"pw-{secrets.token_hex(3)}", "old-password"
    assert admin.post("/api/v1/users", json={"name": name, "password": old_password}).is_success
    with browser(server) as owner, browser(server) as intruder, browser(server) as bystander:
        assert log_in(owner, old_password, name).status_code == 303
        assert log_in(intruder, old_password, name).status_code == 303
        assert log_in(bystander).status_code == 303  # admin: another user
        assert intruder.get("/").status_code == 200
        changed = admin.patch(f"/api/v1/users/{name}", json={"password": "new-password"})
        assert changed.status_code == 200
        for client in (owner, intruder):
            ended = client.get("/")
            assert ended.status_code == 303 and ended.headers["location"] == "/login"
        assert bystander.get("/").status_code == 200
        assert log_in(owner, "new-password", name).status_code == 303
        permissions = {"configure": "", "write": "", "read": "x"}
        assert admin.patch(f"/api/v1/users/{name}", json={"permissions": permissions}).is_success
        assert owner.get("/").status_code == 200  # no new password: the session stays


def test_the_page_with_a_new_token_is_not_cached(server: Server) -> None:
    with browser(server) as client:
        log_in(client)
        csrf = csrf_of(client.get("/users"))
        created = client.post(
            "/tokens", data={"user": "admin", "name": "page"}, headers={"X-CSRF-Token": csrf}
        )
        assert created.status_code == 200 and "qra_" in created.text
        assert created.headers["cache-control"] == "no-store"


def test_the_cluster_page_on_a_single_node(server: Server) -> None:
    with browser(server) as client:
        log_in(client)
        page = client.get("/cluster")
        assert page.status_code == 200
        assert 'aria-current="page">Cluster</a>' in page.text
        assert "this node</span>" in page.text
        refused = client.post(
            "/cluster/leader",
            data={"queue": "nope", "node": ""},
            headers={"X-CSRF-Token": csrf_of(page)},
        )
        assert refused.status_code == 404, refused.text
        assert ">Drain</button>" not in page.text  # a single node has nowhere to drain to
        drain = client.post("/cluster/nodes/node-1/drain", headers={"X-CSRF-Token": csrf_of(page)})
        assert drain.status_code == 409 and "one node" in drain.text, drain.text
