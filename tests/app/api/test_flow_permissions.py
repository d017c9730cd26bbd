"""Permissions on message flow between queues, against a real server: whatever makes the
messages of one queue flow into another (a dead-letter target set on create or by a
policy change, through the API or the dashboard; the dashboard's "Move messages") needs
``read`` on the source and ``write`` on the target. A refused request changes nothing.

The attack each test replays: a user with ``configure`` on ``sec-*`` and ``read``/``write``
only on their own queue points ``sec-*`` at their queue with a 1 ms TTL, or moves its
messages there, and reads them."""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from tests.app.api.conftest import Server, assert_problem, make_token, new_queue, stats

pytestmark = pytest.mark.integration
CSRF = re.compile(r'"X-CSRF-Token": "([^"]+)"')
LOGIN_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


@dataclass(frozen=True)
class Scene:
    secret: str
    """Owned by the admin, holds one message; the user may only configure it."""
    mine: str
    """The user reads and writes it."""
    user: str
    password: str


@pytest.fixture()
def scene(api_server: Server, admin: httpx.Client) -> Scene:
    tag = secrets.token_hex(3)
    secret, mine = new_queue(admin, f"sec-{tag}"), new_queue(admin, f"mine-{tag}")
    published = admin.post(
        f"/api/v1/queues/{secret}/messages", json={"messages": [{"body": "secret"}]}
    )
    assert published.status_code == 201, published.text
    user, password = f"u-{tag}", secrets.token_urlsafe(12)
    permissions = {"configure": f"sec-{tag}.*", "write": mine, "read": mine}
    body = {"name": user, "password": password, "permissions": permissions}
    assert admin.post("/api/v1/users", json=body).status_code == 201
    return Scene(secret, mine, user, password)


@pytest.fixture()
def user_api(api_server: Server, scene: Scene) -> Iterator[httpx.Client]:
    with api_server.client(make_token(api_server, scene.user, scene.password)) as client:
        yield client


@pytest.fixture()
def user_ui(api_server: Server, scene: Scene) -> Iterator[httpx.Client]:
    """A dashboard session of the user, sending its CSRF token as htmx does."""
    with httpx.Client(base_url=api_server.url, timeout=10.0) as client:
        login_page = client.get("/login")
        token = LOGIN_CSRF.search(login_page.text)
        assert token, login_page.text
        form = {"username": scene.user, "password": scene.password, "csrf_token": token[1]}
        assert client.post("/login", data=form).status_code == 303
        csrf = CSRF.search(client.get("/").text)
        assert csrf
        client.headers.update({"X-CSRF-Token": csrf[1], "HX-Request": "true"})
        yield client


def assert_untouched(admin: httpx.Client, scene: Scene) -> None:
    arguments = admin.get(f"/api/v1/queues/{scene.secret}").json()["arguments"]
    assert arguments["dead_letter_queue"] is None and arguments["message_ttl_ms"] is None
    assert stats(admin, scene.secret)["messages_ready"] == 1
    assert stats(admin, scene.mine)["messages_ready"] == 0


def test_api_create_with_a_dead_letter_target_needs_read_on_the_queue(
    admin: httpx.Client, scene: Scene, user_api: httpx.Client
) -> None:
    name = f"{scene.secret}-new"
    dead_letter = {"dead_letter_queue": scene.mine, "message_ttl_ms": 1}
    assert_problem(user_api.put(f"/api/v1/queues/{name}", json=dead_letter), 403, "forbidden")
    assert_problem(admin.get(f"/api/v1/queues/{name}"), 404, "queue-not-found")
    assert user_api.put(f"/api/v1/queues/{name}").status_code == 201  # configure alone suffices


def test_api_policy_change_to_a_dead_letter_target_needs_read_on_the_queue(
    api_server: Server, admin: httpx.Client, scene: Scene, user_api: httpx.Client
) -> None:
    dead_letter = {"dead_letter_queue": scene.mine, "message_ttl_ms": 1}
    refused = user_api.patch(f"/api/v1/queues/{scene.secret}", json=dead_letter)
    assert_problem(refused, 403, "forbidden")
    assert_untouched(admin, scene)
    assert user_api.patch(f"/api/v1/queues/{scene.secret}", json={"max_length": 10}).is_success

    # With read on the source as well, the same change is allowed (RabbitMQ's rule).
    reader = f"r-{secrets.token_hex(3)}"
    permissions = {"configure": scene.secret, "read": scene.secret, "write": scene.mine}
    body = {"name": reader, "password": "reader-password", "permissions": permissions}
    assert admin.post("/api/v1/users", json=body).status_code == 201
    with api_server.client(make_token(api_server, reader, "reader-password")) as allowed:
        changed = allowed.patch(f"/api/v1/queues/{scene.secret}", json=dead_letter)
        assert changed.status_code == 200, changed.text
        assert changed.json()["arguments"]["dead_letter_queue"] == scene.mine


def test_dashboard_create_with_a_dead_letter_target_needs_read_on_the_queue(
    admin: httpx.Client, scene: Scene, user_ui: httpx.Client
) -> None:
    name = f"{scene.secret}-ui"
    form = {"name": name, "dead_letter_queue": scene.mine, "message_ttl_ms": "1"}
    assert user_ui.post("/queues", data=form).status_code == 403
    assert_problem(admin.get(f"/api/v1/queues/{name}"), 404, "queue-not-found")


def test_dashboard_move_needs_read_on_the_source(
    admin: httpx.Client, scene: Scene, user_ui: httpx.Client
) -> None:
    page = user_ui.get(f"/queues/{scene.secret}")
    assert page.status_code == 200 and 'id="redrive-form"' not in page.text
    moved = user_ui.post(f"/queues/{scene.secret}/redrive", data={"target": scene.mine})
    assert moved.status_code == 403, moved.text
    assert_untouched(admin, scene)
