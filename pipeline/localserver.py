"""A throwaway local Quorra server (``quorra serve`` in a subprocess on 127.0.0.1), for
``quorra pipeline demo``, the pipeline tests and ``quorra bench pipeline``. It is
stopped (SIGINT, then kill) when the context ends, with its data directory.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from app.ports import free_port

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class LocalServer:
    url: str
    token: str
    data_dir: Path
    log_path: Path


def _quorra() -> list[str]:
    script = Path(sys.executable).with_name("quorra")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from app.cli import main; main()"]


@contextmanager
def local_server(base_dir: Path | None = None) -> Iterator[LocalServer]:
    """Start a server with a fresh data directory; yields its URL and an admin token."""
    with tempfile.TemporaryDirectory(prefix="quorra-", dir=base_dir) as tmp:
        data_dir = Path(tmp) / "data"
        log_path = Path(tmp) / "server.log"
        port = free_port()
        password = secrets.token_urlsafe(16)
        env = {k: v for k, v in os.environ.items() if not k.startswith("QUORRA_")}
        env["QUORRA_ADMIN_PASSWORD"] = password
        argv = [*_quorra(), "serve", "--data-dir", str(data_dir)]
        argv += ["--host", "127.0.0.1", "--port", str(port)]
        with log_path.open("ab") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_ready(proc, url, log_path)
            response = httpx.post(f"{url}/api/v1/tokens", auth=("admin", password), timeout=10)
            response.raise_for_status()
            yield LocalServer(url, response.json()["token"], data_dir, log_path)
        finally:
            _stop(proc)


def _wait_ready(proc: subprocess.Popen[bytes], url: str, log_path: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"quorra serve exited:\n{log_path.read_text(errors='replace')}")
        try:
            if httpx.get(f"{url}/readyz", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"quorra serve not ready in {START_TIMEOUT_S}s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
