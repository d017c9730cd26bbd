"""The bound on password guessing: unit tests on a fake clock, then through HTTP."""

from __future__ import annotations

import re
import secrets

import httpx
import pytest

from app.throttle import FailureThrottle, TooManyFailures
from tests.app.conftest import Server


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_refuses_after_the_limit_until_the_window_ends() -> None:
    clock = Clock()
    throttle = FailureThrottle(failures_max=3, window_s=60, clock=clock)
    for _ in range(3):
        throttle.check("bob", "10.0.0.1")
        throttle.failed("bob", "10.0.0.1")
    with pytest.raises(TooManyFailures) as caught:
        throttle.check("bob", "10.0.0.1")
    assert caught.value.status == 429 and caught.value.retry_after_s == 60
    throttle.check("bob", "10.0.0.2")  # another address
    throttle.check("alice", "10.0.0.1")  # another user
    clock.now += 59.5
    with pytest.raises(TooManyFailures) as caught:
        throttle.check("bob", "10.0.0.1")
    assert caught.value.retry_after_s == 1
    clock.now += 0.5
    throttle.check("bob", "10.0.0.1")  # the window ended: a fresh start
    throttle.failed("bob", "10.0.0.1")
    throttle.check("bob", "10.0.0.1")


def test_success_clears_and_keys_are_bounded() -> None:
    throttle = FailureThrottle(failures_max=2, window_s=60, keys_max=3, clock=Clock())
    throttle.failed("bob", "a")
    throttle.succeeded("bob", "a")
    throttle.failed("bob", "a")
    throttle.check("bob", "a")
    for user in ("u1", "u2", "u3", "u4"):
        throttle.failed(user, "a")
        throttle.failed(user, "a")
    with pytest.raises(TooManyFailures):
        throttle.check("u4", "a")
    throttle.check("u1", "a")  # forgotten: only keys_max pairs are kept
    throttle.check("bob", "a")


@pytest.mark.integration
def test_password_guessing_is_refused_over_http(server: Server, admin: httpx.Client) -> None:
    name, password = f"g-{secrets.token_hex(3)}", "right-password"
    assert admin.post("/api/v1/users", json={"name": name, "password": password}).status_code == 201
    url = f"{server.url}/api/v1/tokens"
    for _ in range(10):
        assert httpx.post(url, auth=(name, "wrong-password")).status_code == 401
    refused = httpx.post(url, auth=(name, password))
    assert refused.status_code == 429
    assert refused.json()["type"] == "/problems/too-many-failures"
    assert 1 <= int(refused.headers["retry-after"]) <= 300
    with httpx.Client(base_url=server.url) as browser:
        page = browser.get("/login")
        csrf = re.search(r'name="csrf_token" value="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]
        login = browser.post(
            "/login", data={"username": name, "password": password, "csrf_token": csrf}
        )
        assert login.status_code == 429 and "Too many wrong passwords" in login.text
    assert httpx.post(url, auth=("admin", "wrong-password")).status_code == 401  # others unaffected
