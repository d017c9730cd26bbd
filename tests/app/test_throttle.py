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


def fail(throttle: FailureThrottle, user: str, address: str) -> None:
    with throttle.attempt(user, address) as attempt:
        attempt.verdict(False)


def refused(throttle: FailureThrottle, user: str, address: str) -> TooManyFailures:
    with pytest.raises(TooManyFailures) as caught, throttle.attempt(user, address):
        pass
    return caught.value


def test_refuses_after_the_limit_until_the_window_ends() -> None:
    clock = Clock()
    throttle = FailureThrottle(failures_max=3, window_s=60, clock=clock)
    for _ in range(3):
        fail(throttle, "bob", "10.0.0.1")
    error = refused(throttle, "bob", "10.0.0.1")
    assert error.status == 429 and error.retry_after_s == 60
    fail(throttle, "bob", "10.0.0.2")  # another address
    fail(throttle, "alice", "10.0.0.1")  # another user
    clock.now += 59.5
    assert refused(throttle, "bob", "10.0.0.1").retry_after_s == 1
    clock.now += 0.5
    fail(throttle, "bob", "10.0.0.1")  # the window ended: a fresh start
    with throttle.attempt("bob", "10.0.0.1"):
        pass


def test_attempts_in_flight_count_before_their_verdict() -> None:
    """The race of issue 13: checks that started together all count, so the limit holds
    however many guesses arrive at once."""
    throttle = FailureThrottle(failures_max=3, window_s=60, clock=Clock())
    with (
        throttle.attempt("bob", "a") as first,
        throttle.attempt("bob", "a") as second,
        throttle.attempt("bob", "a"),
    ):
        error = refused(throttle, "bob", "a")
        assert error.retry_after_s == 1 and "at once" in error.detail
        with throttle.attempt("carol", "a"):  # other pairs are not held up
            pass
        first.verdict(False)
        second.verdict(False)
    # Two failures; the third attempt gave its place back (no verdict: never checked).
    fail(throttle, "bob", "a")
    assert refused(throttle, "bob", "a").retry_after_s == 60


def test_an_exception_gives_the_place_back() -> None:
    throttle = FailureThrottle(failures_max=1, window_s=60, clock=Clock())
    with pytest.raises(RuntimeError), throttle.attempt("bob", "a"):
        raise RuntimeError("the server was busy")
    assert len(throttle) == 0
    fail(throttle, "bob", "a")
    refused(throttle, "bob", "a")


def test_success_clears_and_keys_are_bounded() -> None:
    throttle = FailureThrottle(failures_max=2, window_s=60, keys_max=3, clock=Clock())
    fail(throttle, "bob", "a")
    with throttle.attempt("bob", "a") as attempt:
        attempt.verdict(True)
    assert len(throttle) == 0  # nothing counted: nothing kept
    fail(throttle, "bob", "a")
    for user in ("u1", "u2", "u3", "u4"):
        fail(throttle, user, "a")
        fail(throttle, user, "a")
    assert len(throttle) == 3
    refused(throttle, "u4", "a")
    fail(throttle, "u1", "a")  # forgotten: only keys_max pairs are kept
    fail(throttle, "bob", "a")


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
