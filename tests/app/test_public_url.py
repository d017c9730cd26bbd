"""The dashboard's example command names the configured URL (``QUORRA_PUBLIC_URL``, else
the listen address), never the request's ``Host`` header, which a client chooses."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from app.settings import Settings
from tests.app.conftest import Server
from tests.app.test_ui import log_in

pytestmark = pytest.mark.integration

SPOOFED = "evil.example:6666"
COMMAND = re.compile(r"<code>curl -u admin:PASSWORD -X POST (\S+)</code>")


def example_url(server: Server) -> str:
    with httpx.Client(base_url=server.url, timeout=10.0) as client:
        assert log_in(client).status_code == 303
        page = client.get("/", headers={"Host": SPOOFED})
    assert page.status_code == 200 and SPOOFED not in page.text
    match = COMMAND.search(page.text)
    assert match, page.text
    return match.group(1)


def test_by_default_the_listen_address(server: Server) -> None:
    assert example_url(server) == f"{server.url}/api/v1/tokens"


def test_the_configured_public_url(tmp_path: Path) -> None:
    env = {"QUORRA_PUBLIC_URL": "https://queues.example.com/"}
    server = Server(tmp_path / "data", env=env).start()
    try:
        assert example_url(server) == "https://queues.example.com/api/v1/tokens"
    finally:
        server.stop()


def test_public_url_setting(tmp_path: Path) -> None:
    wildcard = Settings.from_env(tmp_path, host="0.0.0.0", port=8001, environ={})
    assert wildcard.public_base_url == "http://127.0.0.1:8001"
    with pytest.raises(AssertionError, match="QUORRA_PUBLIC_URL"):
        Settings.from_env(tmp_path, environ={"QUORRA_PUBLIC_URL": "javascript:alert(1)"})
