"""A real Quorra server in a subprocess (``quorra serve``) on 127.0.0.1, with a temporary
data directory and real SQLite; every test that starts one stops it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Self

import httpx
import pytest

from app.ports import free_port

QUORRA = str(Path(sys.executable).with_name("quorra"))
ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
ADMIN_PASSWORD = "admin-test-password"


class Server:
    start_timeout_s = START_TIMEOUT_S
    """How long ``start`` waits for ``/readyz``."""

    def __init__(
        self,
        data_dir: Path,
        admin_password: str | None = ADMIN_PASSWORD,
        env: Mapping[str, str] | None = None,
        port: int = 0,
    ) -> None:
        self.data_dir = data_dir
        self.admin_password = admin_password
        self.env = dict(env or {})
        """More environment for the server (``QUORRA_...`` settings)."""
        self.fixed_port = port
        """The HTTP port of every start; 0: a free one at each start."""
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"{data_dir.name}-server.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        """What runs the server; a subclass may run another entry point."""
        return [QUORRA, "serve", "--data-dir", str(self.data_dir), "--host", "127.0.0.1",
                "--port", str(self.port)]  # fmt: skip

    def start(self) -> Self:
        assert self.proc is None
        self.port = self.fixed_port or free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("QUORRA_")}
        if self.admin_password is not None:
            env["QUORRA_ADMIN_PASSWORD"] = self.admin_password
        env.update(self.env)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.command(),
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"server exited:\n{self.output()}"
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        raise AssertionError(f"server not ready in {self.start_timeout_s}s:\n{self.output()}")

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(STOP_TIMEOUT_S)
        self.proc = None

    def output(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def client(self, token: str | None = None, **kwargs: object) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=10.0, **kwargs)  # type: ignore[arg-type]


def make_token(server: Server, user: str, password: str) -> str:
    response = httpx.post(f"{server.url}/api/v1/tokens", auth=(user, password), timeout=10.0)
    assert response.status_code == 201, response.text
    token = response.json()["token"]
    assert isinstance(token, str)
    return token


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("quorra") / "data").start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="session")
def admin_token(server: Server) -> str:
    return make_token(server, "admin", ADMIN_PASSWORD)


@pytest.fixture(scope="session")
def admin(server: Server, admin_token: str) -> Iterator[httpx.Client]:
    with server.client(admin_token) as client:
        yield client
