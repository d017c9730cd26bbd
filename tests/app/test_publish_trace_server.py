"""``QUORRA_TRACE_PUBLISH_FILE``: a real ``quorra serve`` stamps every stage of publishes
made one at a time on a stream, and writes their summary when it stops; without it, the
server traces nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.publish_trace import STAGES
from quorra.client import Client
from tests.app.conftest import ADMIN_PASSWORD, Server, make_token

pytestmark = pytest.mark.integration

PUBLISHES = 30


def _publish_one_at_a_time(server: Server) -> None:
    token = make_token(server, "admin", ADMIN_PASSWORD)
    with Client(server.url, token) as client:
        with server.client(token) as api:
            assert api.put("/api/v1/queues/traced", json={}).status_code == 201
        with client.stream("traced") as stream:
            for k in range(PUBLISHES):
                stream.wait(stream.publish([f"m{k}".encode()]))


def test_a_traced_server_writes_every_stage_of_each_window_1_publish(tmp_path: Path) -> None:
    out = tmp_path / "trace.json"
    server = Server(tmp_path / "data", env={"QUORRA_TRACE_PUBLISH_FILE": str(out)}).start()
    try:
        _publish_one_at_a_time(server)
    finally:
        server.stop()
    summary = json.loads(out.read_text())
    assert summary["publishes"] == PUBLISHES and summary["overlapped"] == 0
    steps = summary["steps_us"]
    assert len(steps) == len(STAGES)  # each step from a stage to the next, and the whole
    for name, step in steps.items():
        assert 0 <= step["p50_us"] <= step["p99_us"] <= step["max_us"], (name, step)
    # The whole path holds an fdatasync at least: more than any single WAL step.
    whole = steps["received->sent"]["p50_us"]
    assert whole >= steps["written->synced"]["p50_us"] > 0


def test_an_untraced_server_writes_no_trace(tmp_path: Path) -> None:
    server = Server(tmp_path / "data").start()
    try:
        _publish_one_at_a_time(server)
    finally:
        server.stop()
    assert not list(tmp_path.glob("**/*trace*"))
