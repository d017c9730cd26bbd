"""A queue's engine memory as an operator sees it, against a real server: the stats give
the figure and what it is made of, and the dashboard shows both and no engineering
target."""

from __future__ import annotations

import httpx
import pytest

from tests.app.conftest import ADMIN_PASSWORD, Server
from tests.app.test_ui import browser, log_in

pytestmark = pytest.mark.integration


def test_stats_and_dashboard_break_memory_down(server: Server, admin: httpx.Client) -> None:
    assert admin.put("/api/v1/queues/memq", json={}).status_code == 201
    messages = [{"body": f"m{k}"} for k in range(10)]
    response = admin.post("/api/v1/queues/memq/messages", json={"messages": messages})
    assert response.status_code == 201
    got = admin.post("/api/v1/queues/memq/messages/receive", json={"max_messages": 4})
    assert len(got.json()["messages"]) == 4
    stats = admin.get("/api/v1/queues/memq").json()["stats"]
    parts = stats["memory"]
    assert set(parts) == {
        "index_bytes",
        "enqueue_times_bytes",
        "leases_bytes",
        "extras_bytes",
        "fixed_bytes",
    }
    assert sum(parts.values()) == stats["memory_bytes"]
    assert parts["index_bytes"] > 0 and parts["leases_bytes"] > 0 and parts["fixed_bytes"] > 0
    per_message = (stats["memory_bytes"] - parts["fixed_bytes"]) / 10
    assert stats["memory_per_message_bytes"] == round(per_message, 3)
    with browser(server) as client:
        log_in(client, ADMIN_PASSWORD)
        page = client.get("/queues/memq/live").text
    assert "target" not in page
    assert 'id="mem-parts"' in page and "leases" in page and "fixed" in page
