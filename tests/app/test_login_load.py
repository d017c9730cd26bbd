"""Password checks under load, against a real server: a flood of logins neither freezes
the queues nor waits, and the lockout holds when the guesses arrive all at once."""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
import statistics
import subprocess
import sys
import time
from typing import NamedTuple, Self
from urllib.parse import urlencode

import httpx
import pytest

from app.ui.sessions import LOGIN_CSRF_COOKIE
from tests.app.conftest import ROOT, Server
from tests.app.test_ui import csrf_of

pytestmark = pytest.mark.integration

FLOOD_LOGINS = 200
# A loop blocked by password hashing answers in seconds (200 checks of ~25-190 ms each);
# a healthy one in a few milliseconds. 50 ms was missed by 0.1 ms on a 2-core machine busy
# with other work, so the bound sits between the two where load alone does not reach it.
LOOP_P99_MS_MAX = 150.0
ANSWER_S_MAX = 2.0
GUESSES = 100


class Answer(NamedTuple):
    status: int
    seconds: float
    head: str
    """Status line and headers, lower case."""


async def _burst(server: Server, requests: list[bytes]) -> list[Answer]:
    """Every request at once, each on a connection of its own.

    Raw HTTP/1.1 over asyncio streams: an HTTP client library spends milliseconds of CPU
    per request, and two hundred of them would measure the client more than the server.
    """

    async def timed(request: bytes) -> Answer:
        started = time.monotonic()
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(request)
        response = await reader.read()  # the server closes: Connection: close
        writer.close()
        head = response.partition(b"\r\n\r\n")[0].decode("latin-1").lower()
        return Answer(int(head.split()[1]), time.monotonic() - started, head)

    return await asyncio.gather(*(timed(request) for request in requests))


def _post(path: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in {**headers, "Content-Length": str(len(body))}.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def _dashboard_login(csrf: str, cookie: str) -> bytes:
    """A login with an unknown user name, with a valid login CSRF token."""
    form = {"username": f"nobody-{secrets.token_hex(4)}", "password": "guess", "csrf_token": csrf}
    headers = {"Content-Type": "application/x-www-form-urlencoded", "Cookie": cookie}
    return _post("/login", headers, urlencode(form).encode("ascii"))


def _basic_login(user: str, password: str) -> bytes:
    credentials = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
    return _post("/api/v1/tokens", {"Authorization": f"Basic {credentials}"})


class MessageLoop:
    """tests/app/message_loop.py in a process of its own, while the block runs."""

    def __init__(self, server: Server, token: str, queue: str) -> None:
        self.command = [sys.executable, "-m", "tests.app.message_loop", server.url, token, queue]
        self.latencies_ms: list[float] = []

    def __enter__(self) -> Self:
        self.proc = subprocess.Popen(
            self.command, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None and self.proc.stdout.readline() == "started\n"
        return self

    def __exit__(self, *_exc: object) -> None:
        out, _err = self.proc.communicate("stop\n", timeout=30)
        assert self.proc.returncode == 0, out
        self.latencies_ms = json.loads(out)

    def p99_ms(self) -> float:
        return statistics.quantiles(self.latencies_ms, n=100)[98]


def test_a_login_flood_neither_freezes_queues_nor_waits(
    server: Server, admin: httpx.Client, admin_token: str
) -> None:
    """Issue 13: twenty logins at once froze the server for minutes. Two hundred, half on
    the dashboard and half by HTTP Basic, each with a user name of its own (so the lockout
    refuses none), while messages flow: each is answered at once or after a bounded wait,
    and the messages do not notice."""
    queue = f"flood-{secrets.token_hex(3)}"
    assert admin.put(f"/api/v1/queues/{queue}", json={}).status_code == 201
    page = httpx.get(f"{server.url}/login")
    csrf, cookie = csrf_of(page), f"{LOGIN_CSRF_COOKIE}={page.cookies[LOGIN_CSRF_COOKIE]}"
    calls = [_dashboard_login(csrf, cookie) for _ in range(FLOOD_LOGINS // 2)]
    calls += [
        _basic_login(f"nobody-{secrets.token_hex(4)}", "guess") for _ in range(FLOOD_LOGINS // 2)
    ]
    with MessageLoop(server, admin_token, queue) as loop:
        time.sleep(0.3)
        answers = asyncio.run(_burst(server, calls))
        time.sleep(0.3)
    statuses = {a.status for a in answers}
    assert statuses <= {401, 429} and 401 in statuses, statuses
    assert all("\r\nretry-after: 1" in a.head for a in answers if a.status == 429)
    slowest_s = max(a.seconds for a in answers)
    assert slowest_s < ANSWER_S_MAX, f"slowest login answered in {slowest_s:.2f} s"
    assert len(loop.latencies_ms) >= 50
    assert loop.p99_ms() < LOOP_P99_MS_MAX, f"p99 {loop.p99_ms():.1f} ms"


def test_the_lockout_holds_under_concurrent_guesses(server: Server, admin: httpx.Client) -> None:
    """Issue 13: 39 wrong passwords sent together were all checked, and the right one
    after them got a token. Of 100 sent together, at most 10 are checked."""
    name, password = f"race-{secrets.token_hex(3)}", "right-password"
    assert admin.post("/api/v1/users", json={"name": name, "password": password}).status_code == 201
    right_at = GUESSES * 7 // 10
    passwords = ["wrong-password"] * GUESSES
    passwords[right_at] = password
    answers = asyncio.run(_burst(server, [_basic_login(name, p) for p in passwords]))
    statuses = [a.status for a in answers]
    assert statuses.count(401) <= 10, statuses
    assert statuses.count(401) + statuses.count(429) == GUESSES, statuses
    assert statuses[right_at] == 429
