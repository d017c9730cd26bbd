"""First start, restart, and the local CLI, against real server processes."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.app.conftest import QUORRA, Server, make_token

pytestmark = pytest.mark.integration
PRINTED_PASSWORD = re.compile(r"log in as 'admin' with password: (\S+)")


def quorra(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([QUORRA, *args], input=stdin, capture_output=True, text=True, timeout=60)


def test_first_start_prints_a_random_password_once_and_restart_keeps_everything(
    tmp_path: Path,
) -> None:
    server = Server(tmp_path / "data", admin_password=None).start()
    try:
        printed = PRINTED_PASSWORD.findall(server.output())
        assert len(printed) == 1
        assert f"dashboard {server.url}/" in server.output()
        password = printed[0]
        token = make_token(server, "admin", password)
        with server.client(token) as admin:
            assert (
                admin.post(
                    "/api/v1/users", json={"name": "dora", "password": "dora-password"}
                ).status_code
                == 201
            )
        dora_token = make_token(server, "dora", "dora-password")
        browser = httpx.Client(base_url=server.url, follow_redirects=False)
        page = browser.get("/login")
        csrf = re.search(r'name="csrf_token" value="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]
        browser.post("/login", data={"username": "admin", "password": password, "csrf_token": csrf})
        assert browser.get("/").status_code == 200
    finally:
        server.stop()
    assert server.proc is None

    server.start()
    try:
        assert len(PRINTED_PASSWORD.findall(server.output())) == 1  # not again
        with server.client(token) as admin:
            assert {u["name"] for u in admin.get("/api/v1/users").json()} == {"admin", "dora"}
        with server.client(dora_token) as dora:
            assert dora.get("/api/v1/whoami").json()["name"] == "dora"
        assert make_token(server, "admin", password)
        browser.base_url = httpx.URL(server.url)
        assert browser.get("/").status_code == 200  # same secret key: the session survives
    finally:
        browser.close()
        server.stop()


def test_local_cli_adds_users_and_tokens(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    added = quorra(
        "user",
        "add",
        "erin",
        "--password",
        "erin-password",
        "--write",
        "orders.*",
        "--data-dir",
        str(data),
    )
    assert added.returncode == 0, added.stderr
    again = quorra("user", "add", "erin", "--password", "erin-password", "--data-dir", str(data))
    assert again.returncode == 1 and "exists" in again.stderr
    bad = quorra(
        "user",
        "add",
        "frank",
        "--password",
        "frank-password",
        "--read",
        "([",
        "--data-dir",
        str(data),
    )
    assert bad.returncode == 1 and "--read" in bad.stderr
    created = quorra(
        "token", "create", "--user", "erin", "--name", "laptop", "--data-dir", str(data)
    )
    assert created.returncode == 0, created.stderr
    token = created.stdout.strip()
    assert token.startswith("qra_") and "\n" not in token
    assert quorra("token", "create", "--user", "nobody", "--data-dir", str(data)).returncode == 1

    server = Server(data, admin_password="admin-password").start()
    try:
        with server.client(token) as erin:
            me = erin.get("/api/v1/whoami").json()
            assert me["name"] == "erin" and me["permissions"]["write"] == "orders.*"
        # While the server runs, the CLI still works on the same database.
        live = quorra("token", "create", "--user", "admin", "--data-dir", str(data))
        assert live.returncode == 0, live.stderr
        with server.client(live.stdout.strip()) as admin:
            actions = [(e["action"], e["source"]) for e in admin.get("/api/v1/audit").json()]
            assert ("user.create", "cli") in actions and ("token.create", "cli") in actions
    finally:
        server.stop()


def test_client_reports_problems_clearly(server: Server, admin_token: str) -> None:
    published = quorra(
        "publish", "no-such-queue", "--url", server.url, "--token", admin_token, stdin="a\nb\n"
    )
    assert published.returncode == 1
    assert "error:" in published.stderr and "Traceback" not in published.stderr
    assert "HTTP 404" in published.stderr
    no_token = quorra("consume", "orders", "--url", server.url, "--token", "")
    assert no_token.returncode == 1 and "no token" in no_token.stderr


def test_publish_and_consume_lines_end_to_end(
    server: Server, admin: httpx.Client, admin_token: str
) -> None:
    if httpx.get(f"{server.url}/readyz").json()["engine"] == "absent":
        pytest.skip("this build has no queue engine")
    assert admin.put("/api/v1/queues/cli-lines", json={}).status_code in (200, 201)
    lines = "".join(f"line {i} é\n" for i in range(250))
    common = ("--url", server.url, "--token", admin_token)
    published = quorra("publish", "cli-lines", *common, "--batch", "100", stdin=lines)
    assert published.returncode == 0, published.stderr
    assert "published 250 messages" in published.stderr
    consumed = quorra("consume", "cli-lines", *common, "--max", "250", "--batch", "64")
    assert consumed.returncode == 0, consumed.stderr
    assert consumed.stdout == lines
    empty = quorra("consume", "cli-lines", *common, "--wait-ms", "0")
    assert empty.returncode == 0 and empty.stdout == ""
