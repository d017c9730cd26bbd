"""The node's memory alarm against a real server: once the engine's memory would pass
its limit, publishes get 429 with Retry-After (problem ``memory-alarm``) while consuming
and purging still work, and the alarm clears by itself once memory is back under."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.app.conftest import ADMIN_PASSWORD, Server, make_token
from tests.app.test_paging_server import TINY_PAGES

pytestmark = pytest.mark.integration

LIMIT_BYTES = 200_000
"""A few empty queues' worth, and a few thousand delayed messages (the delayed heap is
engine memory: it is not paged)."""


@pytest.fixture
def alarmed(tmp_path: Path) -> Iterator[Server]:
    env = {**TINY_PAGES, "QUORRA_ENGINE_MEMORY_BYTES_MAX": str(LIMIT_BYTES)}
    srv = Server(tmp_path / "data", env=env).start()
    try:
        yield srv
    finally:
        srv.stop()


def publish(api: httpx.Client, queue: str, start: int, delay_ms: int = 0) -> httpx.Response:
    batch = [{"body": f"m{k}", "delay_ms": delay_ms} for k in range(start, start + 200)]
    return api.post(f"/api/v1/queues/{queue}/messages", json={"messages": batch})


def publish_until_refused(api: httpx.Client) -> httpx.Response:
    """Delayed messages until a publish is refused with the WAL's mem tables emptied.

    A refusal asks the WAL to roll, which gives the mem tables' share back: a refusal that
    only they caused clears within a moment. Past it, the delayed heap alone holds the
    alarm, so what follows does not race the roll."""
    start = 0
    for _ in range(100):
        response = publish(api, "held", start, delay_ms=600_000)
        start += 200
        if response.status_code == 201:
            continue
        time.sleep(0.5)
        again = publish(api, "held", start, delay_ms=600_000)
        start += 200
        if again.status_code != 201:
            return again
    raise AssertionError("the delayed messages never reached the limit")


def refused_total(metrics: str) -> float:
    name = "quorra_memory_alarm_publishes_refused_total "
    line = next(line for line in metrics.splitlines() if line.startswith(name))
    return float(line.removeprefix(name))


def test_publishes_are_refused_past_the_limit_and_accepted_again_after(alarmed: Server) -> None:
    with alarmed.client(make_token(alarmed, "admin", ADMIN_PASSWORD)) as api:
        for name in ("held", "other"):
            assert api.put(f"/api/v1/queues/{name}", json={}).status_code == 201
        refused = publish_until_refused(api)
        assert refused.status_code == 429, refused.text
        assert refused.headers["Retry-After"] == "1"
        problem = refused.json()
        assert problem["type"] == "/problems/memory-alarm" and "engine memory" in problem["detail"]
        # Every queue of the node is refused, not only the one that holds the memory.
        assert publish(api, "other", 0).status_code == 429
        memory = api.get("/metrics").text
        assert "quorra_memory_alarm 1.0" in memory
        assert refused_total(memory) >= 2
        assert api.post("/api/v1/queues/held/purge").status_code == 200
        deadline = time.monotonic() + 5
        while (response := publish(api, "other", 0)).status_code == 429:
            assert time.monotonic() < deadline, "the alarm did not clear"
            time.sleep(0.05)
        assert response.status_code == 201, response.text
        got = api.post("/api/v1/queues/other/messages/receive", json={"max_messages": 10})
        assert [m["body"] for m in got.json()["messages"]] == [f"m{k}" for k in range(10)]
        assert "quorra_memory_alarm 0.0" in api.get("/metrics").text
