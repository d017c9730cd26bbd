"""Time-to-live against a real server: queue-level ``message_ttl_ms`` and message-level
``ttl_ms`` of 50, 300 and 2,000 ms are never early and never more than 50 ms late.

Every case runs on queues of its own, all at once (a thread each), so the whole takes
about the longest TTL. The server's clock is this machine's, so client times bound the
leader time of each step: a publish entry was stamped within [sent, answered] of the
publish request, and a checkout (or the expire sweep a stats call observes) within
[sent, answered] of its request. The checks use only those bounds, so a slow machine
makes them pass vacuously rather than fail:

* never early: an answer that arrives before ``publish sent + TTL`` still holds the message;
* never late: a request sent after ``publish answered + TTL + 50 ms`` no longer does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.app.api.conftest import ADMIN_PASSWORD, Server, make_token, new_queue, stats

pytestmark = pytest.mark.integration

TTLS_MS = (50, 300, 2000)
LATE_MS = 50
PROBES = 4
"""Messages of one publish batch, taken one per receive at offsets around the TTL."""


def _now_ms() -> float:
    return time.time() * 1000


def _sleep_until(at_ms: float) -> None:
    time.sleep(max(0.0, (at_ms - _now_ms()) / 1000))


def _publish(client: httpx.Client, queue: str, n: int, ttl_ms: int | None) -> tuple[float, float]:
    """(sent, answered) client times of a publish of ``n`` messages in one entry."""
    message: dict[str, Any] = {"body": "m"} if ttl_ms is None else {"body": "m", "ttl_ms": ttl_ms}
    sent = _now_ms()
    response = client.post(f"/api/v1/queues/{queue}/messages", json={"messages": [message] * n})
    assert response.status_code == 201, response.text
    return sent, _now_ms()


def _receives(client: httpx.Client, queue: str, ttl_ms: int, per_message: bool) -> list[str]:
    """One batch of ``PROBES`` messages, then receives of one message at offsets around
    the TTL; returns the violations seen."""
    sent, answered = _publish(client, queue, PROBES, ttl_ms if per_message else None)
    offsets = (max(5, ttl_ms - 40), max(15, ttl_ms - 15), ttl_ms + LATE_MS + 10, ttl_ms + 150)
    bad = []
    for offset in offsets:
        _sleep_until(answered + offset)
        asked = _now_ms()
        response = client.post(
            f"/api/v1/queues/{queue}/messages/receive", json={"max_messages": 1, "wait_ms": 0}
        )
        got = _now_ms()
        assert response.status_code == 200, response.text
        messages = response.json()["messages"]
        if not messages and got < sent + ttl_ms:
            bad.append(f"expired early: answered {got - sent:.0f} ms after the publish was sent")
        if messages and asked > answered + ttl_ms + LATE_MS:
            bad.append(f"delivered late: asked {asked - answered:.0f} ms after it was stored")
    return bad


def _sweep(client: httpx.Client, queue: str, ttl_ms: int, per_message: bool) -> list[str]:
    """One message no one receives: the leader's expire timer must remove it on time."""
    sent, answered = _publish(client, queue, 1, ttl_ms if per_message else None)
    bad = []
    while True:
        asked = _now_ms()
        s = stats(client, queue)
        got = _now_ms()
        if s["messages_ready"] == 0:
            if got < sent + ttl_ms:
                bad.append(f"swept early: seen {got - sent:.0f} ms after the publish was sent")
            return bad
        if asked > answered + ttl_ms + LATE_MS:
            return [f"swept late: still ready {asked - answered:.0f} ms after it was stored"]
        time.sleep(0.005)


def test_ttl_is_never_early_and_at_most_50_ms_late(api_server: Server) -> None:
    token = make_token(api_server, "admin", ADMIN_PASSWORD)
    cases: list[tuple[str, Callable[[httpx.Client, str, int, bool], list[str]], int, bool]] = []
    with api_server.client(token) as admin:
        for ttl_ms in TTLS_MS:
            for per_message in (False, True):
                policy = {} if per_message else {"message_ttl_ms": ttl_ms}
                for check in (_receives, _sweep):
                    cases.append((new_queue(admin, "ttl", **policy), check, ttl_ms, per_message))
    found: dict[str, list[str]] = {}

    def run(queue: str, check: Callable[..., list[str]], ttl_ms: int, per_message: bool) -> None:
        with api_server.client(token) as client:
            kind = "ttl_ms" if per_message else "message_ttl_ms"
            found[f"{check.__name__[1:]} {kind}={ttl_ms}"] = check(
                client, queue, ttl_ms, per_message
            )

    threads = [threading.Thread(target=run, args=case) for case in cases]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(found) == len(cases)
    assert {case: bad for case, bad in found.items() if bad} == {}
