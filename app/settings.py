"""Settings of one Quorra server process.

Settings are a frozen value built once (``Settings.from_env``) and handed to
``create_app``; nothing reads the environment after that. The only file they touch is
the secret key, which ``load_secret_key`` creates in the data directory on first start
so that session cookies survive a restart.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from engine.limits import DEFAULT_LIMITS, MIB, Limits
from engine.node_key import load_node_secret

PROJECT_ROOT = Path(__file__).resolve().parent.parent
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
    limits: Limits = DEFAULT_LIMITS
    templates_dir: Path = PROJECT_ROOT / "templates"
    static_dir: Path = PROJECT_ROOT / "static"
    migrations_dir: Path = PROJECT_ROOT / "migrations"

    def __post_init__(self) -> None:
        assert 0 <= self.port <= 65535
        assert self.session_ttl_s > 0
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
    """Read the key that signs session cookies, creating it (mode 0600) on first start:
    the node's secret (engine/node_key.py), from which the engine derives its keys."""
    return load_node_secret(data_dir)
