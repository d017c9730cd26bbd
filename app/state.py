"""Typed reads of ``app.state``: one accessor per item.

Rule: ``create_app`` and its lifespan (app/main.py) set these items; every other module
reads them through an accessor here, never as an attribute of ``request.app.state``,
which Starlette types as ``Any``. An accessor names the item's type once, so that a
renamed or retyped item fails ``mypy`` here instead of at a reader.

The items, in the order the app sets them: ``settings``, ``metrics``,
``login_throttle``, ``token_cache``, ``publish_trace`` (create_app);
``ready``, ``node``, ``engine`` (the node's start-up status), ``migrations``,
``session_signer``, ``passwords``, ``db`` (the lifespan). The dashboard adds
``series`` and ``engine_reads`` itself (app/ui/series.py, app/ui/reads.py), and
``templates_of`` adds ``templates`` at the first page.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from starlette.datastructures import State

if TYPE_CHECKING:
    from fastapi.templating import Jinja2Templates

    from app.cluster_mirror import ClusterMirror
    from app.db.session import Database
    from app.metrics import AppMetrics
    from app.passwords import PasswordWorkers
    from app.settings import Settings
    from app.throttle import FailureThrottle
    from app.token_cache import TokenCache
    from app.ui.sessions import SessionSigner
    from engine.publish_trace import PublishTrace
    from engine.runtime.api import QueueEngine


def _items(state: State) -> dict[str, Any]:
    """The items themselves, for the accessors read on every request: an item read as an
    attribute is found only after the instance's and the class's lookups fail, through
    ``State.__getattr__`` (the failed lookup builds an ``AttributeError`` each time),
    about a microsecond per read, and a message request reads several."""
    return state._state


def settings_of(state: State) -> Settings:
    settings: Settings = _items(state)["settings"]
    return settings


def metrics_of(state: State) -> AppMetrics:
    metrics: AppMetrics = state.metrics
    return metrics


def login_throttle_of(state: State) -> FailureThrottle:
    throttle: FailureThrottle = state.login_throttle
    return throttle


def token_cache_of(state: State) -> TokenCache:
    cache: TokenCache = _items(state)["token_cache"]
    return cache


def templates_of(state: State) -> Jinja2Templates:
    """The dashboard's templates, made at the first page rendered rather than by
    ``create_app``: Jinja costs ~25 ms of CPU to import, a start's 1% that a server only
    serving the API never needs."""
    templates: Jinja2Templates | None = _items(state).get("templates")
    if templates is None:
        from fastapi.templating import Jinja2Templates

        templates = Jinja2Templates(directory=settings_of(state).templates_dir)
        # Templates are part of the release: checking each file's mtime on every render
        # (Jinja's default) costs a system call per page and per included template.
        templates.env.auto_reload = False
        state.templates = templates
    return templates


def ready_of(state: State) -> bool:
    return bool(state.ready)


def publish_trace_of(state: State) -> PublishTrace | None:
    """The trace of publishes' stages when ``Settings.trace_publish_file`` is set."""
    trace: PublishTrace | None = state.publish_trace
    return trace


def node_or_none(state: State) -> QueueEngine | None:
    """The running engine node; ``None`` before it started and once it stops."""
    node: QueueEngine | None = _items(state)["node"]
    return node


def mirror_of(state: State) -> ClusterMirror | None:
    """A cluster node's mirror of the metadata's users and tokens (app/cluster_mirror.py),
    through which their changes go; ``None`` on a single node."""
    mirror: ClusterMirror | None = getattr(state, "mirror", None)
    return mirror


EngineStatus = Literal["absent", "recovering", "recovered"]
"""Where the node's start-up is, as ``/readyz`` tells it."""


def engine_status_of(state: State) -> EngineStatus:
    status: EngineStatus = state.engine_status
    return status


def migrations_of(state: State) -> str | None:
    """The metadata's Alembic revision once migrated, else ``None``."""
    revision: str | None = state.migrations
    return revision


def session_signer_of(state: State) -> SessionSigner:
    signer: SessionSigner = state.session_signer
    return signer


def passwords_of(state: State) -> PasswordWorkers:
    passwords: PasswordWorkers = state.passwords
    return passwords


def db_of(state: State) -> Database:
    db: Database = state.db
    return db


__all__ = [
    "EngineStatus",
    "db_of",
    "engine_status_of",
    "login_throttle_of",
    "metrics_of",
    "migrations_of",
    "node_or_none",
    "passwords_of",
    "ready_of",
    "session_signer_of",
    "settings_of",
    "templates_of",
    "token_cache_of",
]
