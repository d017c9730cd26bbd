"""``quorra publish`` and ``quorra consume`` against a real server, as a newcomer runs
them: lines in, lines out, with a token made by ``quorra token create``."""

from __future__ import annotations

import os
import subprocess

import httpx
import pytest

from tests.app.api.conftest import Server
from tests.app.conftest import QUORRA

pytestmark = pytest.mark.integration


def quorra(
    *args: str, stdin: bytes = b"", token: str = "", url: str = ""
) -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUORRA_")}
    if token:
        env["QUORRA_TOKEN"] = token
    if url:
        env["QUORRA_URL"] = url
    return subprocess.run([QUORRA, *args], input=stdin, capture_output=True, env=env, timeout=60)


def test_publish_then_consume_lines(api_server: Server, admin: httpx.Client) -> None:
    made = quorra("token", "create", "--user", "admin", "--data-dir", str(api_server.data_dir))
    assert made.returncode == 0, made.stderr
    token = made.stdout.decode().strip()
    assert admin.put("/api/v1/queues/cli-lines").status_code == 201

    lines = [f"line {i} ünïcode" for i in range(250)]
    stdin = ("\n".join(lines) + "\n").encode("utf-8")
    published = quorra(
        "publish", "cli-lines", "--batch", "100", stdin=stdin, token=token, url=api_server.url
    )
    assert published.returncode == 0, published.stderr
    assert b"published 250" in published.stderr
    assert admin.get("/api/v1/queues/cli-lines").json()["stats"]["messages_ready"] == 250

    consumed = quorra(
        "consume", "cli-lines", "--max", "250", "--wait-ms", "500", token=token, url=api_server.url
    )
    assert consumed.returncode == 0, consumed.stderr
    assert consumed.stdout.decode("utf-8").splitlines() == lines
    stats = admin.get("/api/v1/queues/cli-lines").json()["stats"]
    assert stats["messages_ready"] == 0 and stats["messages_unacked"] == 0


def test_cli_reports_problems_clearly(api_server: Server) -> None:
    bad = quorra("publish", "anything", stdin=b"x\n", token="qra_wrong", url=api_server.url)
    assert bad.returncode == 1 and b"HTTP 401" in bad.stderr
