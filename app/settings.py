"""Settings of one Quorra server process.

Settings are a frozen value built once (``Settings.from_env``) and handed to
``create_app``; nothing reads the environment after that. The only file they touch is
the secret key, which ``load_secret_key`` creates in the data directory on first start
so that session cookies survive a restart. The cluster settings (``--node-id``,
``--peers`` and the rest) are parsed and checked in app/cluster_settings.py.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from app.cluster_settings import (
    ClusterFlags,
    ClusterSettings,
    SettingsError,
    cluster_settings,
    given_node_id,
)
from engine.limits import DEFAULT_LIMITS, MIB, Limits
from engine.node_key import load_node_secret

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DATABASE_FILE = "meta.sqlite3"
HEADER_READ_TIMEOUT_S_DEFAULT = 10.0
METADATA_MIRROR_WAIT_MS_DEFAULT = 10_000
LIMITS_FROM_ENV = (
    "page_refs",
    "paged_index_bytes_per_queue_max",
    "paged_index_bytes_per_node_max",
    "page_read_ahead",
    "engine_memory_bytes_max",
    "read_cache_bytes_max",
    "queue_sleep_idle_ms",
)
"""The engine limits a server takes from its environment, each as ``QUORRA_<NAME>``
(upper case): the memory budgets an operator sizes to the machine (and tests make
tiny), and how long a queue stays idle before it sleeps. The others keep their
defaults."""


@dataclass(frozen=True, slots=True)
class Settings:
    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 8000
    admin_password: str | None = None
    """``QUORRA_ADMIN_PASSWORD``: the bootstrap admin's password; random when unset."""
    node_name: str = field(default_factory=socket.gethostname)
    """This process's name in the node registry and, in a cluster, its node id
    (``--node-id``/``QUORRA_NODE_ID``; ``QUORRA_NODE_NAME`` or the host name for a
    single node)."""
    cluster: ClusterSettings | None = None
    """``None``: a single-node server (no ``--peers``)."""
    session_ttl_s: int = 12 * 3600
    """How long a dashboard login lasts."""
    request_body_bytes_max: int = DEFAULT_LIMITS.batch_bytes_max * 4 // 3 + 1 * MIB
    """A full batch, base64-encoded in JSON, fits; anything larger is 413 before parsing."""
    public_url: str = ""
    """``QUORRA_PUBLIC_URL``: where clients reach this server (e.g. behind a proxy), for
    the commands the dashboard shows; empty: the listen address. Never the request's
    ``Host`` header, which a client chooses."""
    header_read_timeout_s: float = HEADER_READ_TIMEOUT_S_DEFAULT
    """``QUORRA_HEADER_READ_TIMEOUT_S``: a connection that has not sent a request's
    headers this long after it opened (or after its last response) is closed."""
    metadata_mirror_wait_ms: int = METADATA_MIRROR_WAIT_MS_DEFAULT
    """``QUORRA_METADATA_MIRROR_WAIT_MS``: how long a cluster node's start waits for the
    cluster metadata's users and tokens to reach its SQLite; a node that cannot reach the
    metadata's majority turns ready without them once it has waited this long. This
    node's alone: unlike the engine limits, peers need not agree on it."""
    password_workers: int = 2
    """Password checks and hashes (argon2, ~100 ms of CPU each) running at once."""
    password_waiting_max: int = 8
    """Password checks waiting for a worker; more logins than that at once are 429."""
    password_wait_ms_max: int = 500
    """How long a password check waits for a worker before it is refused (429)."""
    limits: Limits = DEFAULT_LIMITS
    trace_publish_file: Path | None = None
    """``QUORRA_TRACE_PUBLISH_FILE``: a measuring aid, off by default. When set, the stages
    of publishes made one at a time (a window-1 stream) are stamped
    (``engine.publish_trace``) and their summary is written to this file as JSON when the
    server stops (``quorra bench rest --trace-publish``)."""
    templates_dir: Path = PROJECT_ROOT / "templates"
    static_dir: Path = PROJECT_ROOT / "static"
    migrations_dir: Path = PROJECT_ROOT / "migrations"

    def __post_init__(self) -> None:
        assert 0 <= self.port <= 65535
        assert self.session_ttl_s > 0
        assert self.header_read_timeout_s > 0
        assert self.metadata_mirror_wait_ms >= 0
        assert self.public_url == "" or self.public_url.startswith(("http://", "https://")), (
            f"QUORRA_PUBLIC_URL {self.public_url!r} is no http:// or https:// URL"
        )
        assert self.password_workers >= 1 and self.password_waiting_max >= 0
        assert self.password_wait_ms_max > 0
        assert self.request_body_bytes_max >= self.limits.batch_bytes_max
        assert self.cluster is None or self.cluster.node_id == self.node_name

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

    @property
    def public_base_url(self) -> str:
        """``public_url`` without a trailing slash, else the listen address."""
        return self.public_url.rstrip("/") or reachable(self.base_url)

    @classmethod
    def from_env(
        cls,
        data_dir: Path,
        host: str = "127.0.0.1",
        port: int = 8000,
        environ: Mapping[str, str] | None = None,
        cluster_flags: ClusterFlags | None = None,
    ) -> Settings:
        """Raises ``SettingsError`` (app/cluster_settings.py) for a bad cluster setting."""
        env = os.environ if environ is None else environ
        flags = cluster_flags or ClusterFlags()
        node_name = env.get("QUORRA_NODE_NAME") or None
        node_id = given_node_id(flags, env, node_name)
        return cls(
            data_dir=data_dir.resolve(),
            host=host,
            port=port,
            admin_password=env.get("QUORRA_ADMIN_PASSWORD") or None,
            node_name=node_id or node_name or socket.gethostname(),
            cluster=cluster_settings(flags, env, node_name),
            public_url=env.get("QUORRA_PUBLIC_URL", ""),
            header_read_timeout_s=float(
                env.get("QUORRA_HEADER_READ_TIMEOUT_S") or HEADER_READ_TIMEOUT_S_DEFAULT
            ),
            metadata_mirror_wait_ms=_wait_ms_from_env(env, "QUORRA_METADATA_MIRROR_WAIT_MS"),
            limits=limits_from_env(env),
            trace_publish_file=Path(trace)
            if (trace := env.get("QUORRA_TRACE_PUBLISH_FILE"))
            else None,
        )


def _wait_ms_from_env(env: Mapping[str, str], name: str) -> int:
    wait_ms = _int_from_env(env, name)
    if wait_ms is None:
        return METADATA_MIRROR_WAIT_MS_DEFAULT
    if wait_ms < 0:
        raise SettingsError(f"{name}: {env[name]!r} is negative")
    return wait_ms


def _int_from_env(env: Mapping[str, str], name: str) -> int | None:
    """The integer ``name`` holds, ``None`` when unset or empty (``SettingsError`` for
    anything else)."""
    text = env.get(name)
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise SettingsError(f"{name}: {text!r} is not an integer") from None


def limits_from_env(env: Mapping[str, str]) -> Limits:
    """``DEFAULT_LIMITS`` with the fields of ``LIMITS_FROM_ENV`` the environment sets
    (``SettingsError`` for a value that is no integer or breaks a relation)."""
    given: dict[str, int] = {}
    for name in LIMITS_FROM_ENV:
        value = _int_from_env(env, f"QUORRA_{name.upper()}")
        if value is not None:
            given[name] = value
    if not given:
        return DEFAULT_LIMITS
    try:
        return dataclasses.replace(DEFAULT_LIMITS, **given)
    except AssertionError:
        shown = ", ".join(f"QUORRA_{k.upper()}={v}" for k, v in given.items())
        raise SettingsError(f"{shown}: these limits contradict each other") from None


def reachable(url: str) -> str:
    """A wildcard listen address is where the server listens, not where a client can
    go: the loopback address in its place."""
    return url.replace("//0.0.0.0:", "//127.0.0.1:").replace("//[::]:", "//[::1]:")


def load_secret_key(data_dir: Path) -> bytes:
    """Read the key that signs session cookies, creating it (mode 0600) on first start:
    the node's secret (engine/node_key.py), from which the engine derives its keys."""
    return load_node_secret(data_dir)
