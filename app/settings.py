"""Settings of one Quorra server process.

Settings are a frozen value built once (``Settings.from_env``) and handed to
``create_app``; nothing reads the environment after that. The only file they touch is
the secret key, which ``load_secret_key`` creates in the data directory on first start
so that session cookies survive a restart.
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from engine.limits import DEFAULT_LIMITS, MIB, Limits

PROJECT_ROOT = Path(__file__).resolve().parent.parent
SECRET_KEY_FILE = "secret.key"
DATABASE_FILE = "meta.sqlite3"


@dataclass(frozen=True, slots=True)
class Settings:
    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 8000
    admin_password: str | None = None
    """``QUORRA_ADMIN_PASSWORD``: the bootstrap admin's password; random when unset."""
    node_name: str = field(default_factory=socket.gethostname)
    """``QUORRA_NODE_NAME``: this process's name in the node registry (and, later, a cluster)."""
    session_ttl_s: int = 12 * 3600
    """How long a dashboard login lasts."""
    request_body_bytes_max: int = DEFAULT_LIMITS.batch_bytes_max * 4 // 3 + 1 * MIB
    """A full batch, base64-encoded in JSON, fits; anything larger is 413 before parsing."""
    password_workers: int = 2
    """Password checks and hashes (argon2, ~100 ms of CPU each) running at once."""
    password_waiting_max: int = 8
    """Password checks waiting for a worker; more logins than that at once are 429."""
    password_wait_ms_max: int = 500
    """How long a password check waits for a worker before it is refused (429)."""
    limits: Limits = DEFAULT_LIMITS
    templates_dir: Path = PROJECT_ROOT / "templates"
    static_dir: Path = PROJECT_ROOT / "static"
    migrations_dir: Path = PROJECT_ROOT / "migrations"

    def __post_init__(self) -> None:
        assert 0 <= self.port <= 65535
        assert self.session_ttl_s > 0
        assert self.password_workers >= 1 and self.password_waiting_max >= 0
        assert self.password_wait_ms_max > 0
        assert self.request_body_bytes_max >= self.limits.batch_bytes_max

    @property
    def database_path(self) -> Path:
        return self.data_dir / DATABASE_FILE

    @property
    def database_url(self) -> str:
        return f"sqlite:///{self.database_path}"

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @classmethod
    def from_env(
        cls,
        data_dir: Path,
        host: str = "127.0.0.1",
        port: int = 8000,
        environ: Mapping[str, str] | None = None,
    ) -> Settings:
        env = os.environ if environ is None else environ
        return cls(
            data_dir=data_dir.resolve(),
            host=host,
            port=port,
            admin_password=env.get("QUORRA_ADMIN_PASSWORD") or None,
            node_name=env.get("QUORRA_NODE_NAME") or socket.gethostname(),
        )


def load_secret_key(data_dir: Path) -> bytes:
    """Read the key that signs session cookies, creating it (mode 0600) on first start."""
    path = data_dir / SECRET_KEY_FILE
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(secrets.token_hex(32))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    key = path.read_text(encoding="ascii").strip()
    assert len(key) >= 32, f"{path} is too short to be a secret key"
    return key.encode("ascii")
