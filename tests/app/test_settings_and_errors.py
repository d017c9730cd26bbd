"""Settings from the environment, and the last-resort error handler."""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx
import orjson
import pytest
from fastapi import APIRouter

from app.cluster_settings import SettingsError
from app.main import create_app
from app.problems import typed_problem
from app.settings import Settings, load_secret_key
from engine.errors import OutcomeUnknown
from engine.limits import DEFAULT_LIMITS


def test_settings_from_env(tmp_path: Path) -> None:
    env = {
        "QUORRA_ADMIN_PASSWORD": "pw-from-env",
        "QUORRA_NODE_NAME": "node-a",
        "QUORRA_HEADER_READ_TIMEOUT_S": "2.5",
    }
    settings = Settings.from_env(tmp_path / "d", host="::1", port=9000, environ=env)
    assert settings.admin_password == "pw-from-env" and settings.node_name == "node-a"
    assert settings.header_read_timeout_s == 2.5
    assert settings.data_dir.is_absolute()
    assert settings.base_url == "http://[::1]:9000"
    assert settings.database_url == f"sqlite:///{settings.data_dir / 'meta.sqlite3'}"
    empty = Settings.from_env(tmp_path / "d", environ={"QUORRA_ADMIN_PASSWORD": ""})
    assert empty.admin_password is None and empty.node_name
    assert empty.header_read_timeout_s == 10.0


def test_the_metadata_mirror_wait_comes_from_the_environment(tmp_path: Path) -> None:
    assert Settings.from_env(tmp_path / "d", environ={}).metadata_mirror_wait_ms == 10_000
    env = {"QUORRA_METADATA_MIRROR_WAIT_MS": "500"}
    settings = Settings.from_env(tmp_path / "d", environ=env)
    assert settings.metadata_mirror_wait_ms == 500
    assert settings.limits is DEFAULT_LIMITS  # peers compare limits, not this wait
    for text, why in (("soon", "is not an integer"), ("-1", "is negative")):
        with pytest.raises(SettingsError, match=f"QUORRA_METADATA_MIRROR_WAIT_MS: '{text}' {why}"):
            Settings.from_env(tmp_path / "d", environ={"QUORRA_METADATA_MIRROR_WAIT_MS": text})


def test_page_budgets_come_from_the_environment(tmp_path: Path) -> None:
    env = {
        "QUORRA_PAGE_REFS": "64",
        "QUORRA_PAGED_INDEX_BYTES_PER_QUEUE_MAX": "2048",
        "QUORRA_PAGED_INDEX_BYTES_PER_NODE_MAX": "8192",
        "QUORRA_PAGE_READ_AHEAD": "0",
    }
    limits = Settings.from_env(tmp_path / "d", environ=env).limits
    assert (limits.page_refs, limits.page_read_ahead) == (64, 0)
    assert limits.paged_index_bytes_per_queue_max == 2048
    assert limits.paged_index_bytes_per_node_max == 8192
    assert limits.batch_bytes_max == DEFAULT_LIMITS.batch_bytes_max
    assert Settings.from_env(tmp_path / "d", environ={}).limits is DEFAULT_LIMITS
    with pytest.raises(SettingsError, match="QUORRA_PAGE_REFS: 'many' is not an integer"):
        Settings.from_env(tmp_path / "d", environ={"QUORRA_PAGE_REFS": "many"})
    with pytest.raises(SettingsError, match="contradict"):  # a queue's budget over the node's
        Settings.from_env(
            tmp_path / "d", environ={"QUORRA_PAGED_INDEX_BYTES_PER_QUEUE_MAX": str(1 << 40)}
        )


def test_secret_key_is_made_once_and_kept(tmp_path: Path) -> None:
    first = load_secret_key(tmp_path / "d")
    assert len(first) == 64 and load_secret_key(tmp_path / "d") == first
    assert (tmp_path / "d" / "secret.key").stat().st_mode & 0o777 == 0o600


def test_an_unexpected_error_is_a_500_problem_without_trace(tmp_path: Path) -> None:
    app = create_app(
        Settings(data_dir=tmp_path / "d", admin_password="admin-password"),
        node_factory=lambda s: None,
    )
    router = APIRouter()

    @router.get("/boom")
    def boom() -> None:
        raise RuntimeError("secret internals /etc/passwd")

    app.include_router(router)

    async def run() -> httpx.Response:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                return await client.get("/boom")

    response = anyio.run(run)
    assert response.status_code == 500
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json() == {
        "type": "/problems/internal",
        "title": "Internal error",
        "status": 500,
        "detail": "the server failed; see its log",
    }
    assert "secret internals" not in response.text and "Traceback" not in response.text


def test_an_outcome_unknown_is_a_503_problem_to_retry() -> None:
    """A call to another node that never answered: the client retries (with its dedup id)."""
    response = typed_problem(OutcomeUnknown("node n2: connection lost"))
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "1"
    assert orjson.loads(response.body) == {
        "type": "/problems/outcome-unknown",
        "title": "Outcome unknown",
        "status": 503,
        "detail": "node n2: connection lost",
    }
