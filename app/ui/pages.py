"""Dashboard pages that only read: overview, the queue list and a queue's detail, each
with the fragments htmx polls for its live parts.

Endpoints are ``async``: the engine's state changes on the event loop only, so its
``stats``/``segments``/``cluster`` are read there too. History comes from SQLite in a
short transaction on a worker thread (bounded reads), and the analytics summary from
its file there too: the event loop never waits on SQLite or the disk.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Literal

import anyio
from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse

from app.api.deps import QueueName
from app.api.ops import readiness
from app.api.queue_ops import cluster_seen_by
from app.auth import Principal
from app.names import UNADDRESSABLE_QUEUE_NAMES
from app.queue_history import queue_history
from app.state import db_of, node_or_none, settings_of
from app.ui.charts import history_chart, line_chart
from app.ui.common import can, flash, node_of, render
from app.ui.reads import LIST_AGE_S, reads_of
from app.ui.series import Sample, collect, store_of
from app.ui.sessions import UiLogin
from app.ui.views import LoginDep
from engine.errors import QueueNotFound, QuorraError
from engine.runtime.api import BrowsedMessage, QueueEngine, QueueInfo

router = APIRouter(include_in_schema=False)

ROWS_MAX = 200
"""Queue rows shown at once; the filter narrows the rest."""
DEEPEST_SHOWN = 8
BROWSE_LIMIT = 20
BODY_CHARS_SHOWN = 2000
HISTORY_ROWS_SHOWN = 20
CHART_HISTORY_MAX = 100
ANALYTICS_DIR = "reports"
ANALYTICS_BYTES_MAX = 1 << 20


# --- overview ----------------------------------------------------------------------


def _overview_context(request: Request, login: UiLogin) -> dict[str, object]:
    node = node_or_none(request.app.state)
    store = store_of(request.app)
    totals = store.latest_totals()
    if totals is None and node is not None:
        totals = collect(node, None)
    rings = list(store.totals)
    visible = [(n, s) for n, s in store.latest() if login.principal.can_see(n)]
    deepest = sorted(visible, key=lambda pair: -(pair[1].ready + pair[1].unacked))[:DEEPEST_SHOWN]
    return {
        "readiness": readiness(request),
        "public_url": settings_of(request.app.state).public_base_url,
        "cluster": (
            cluster_seen_by(node, login.principal)
            if node is not None
            else {"node": "", "nodes": []}
        ),
        "wal": node.wal_stats() if node is not None else None,
        "memory": node.memory() if node is not None else None,
        "totals": totals,
        "deepest": [(n, s) for n, s in deepest if s.ready + s.unacked > 0],
        "rates_chart": line_chart(
            [
                ("publish", [t.publish_rate for t in rings]),
                ("deliver", [t.deliver_rate for t in rings]),
                ("ack", [t.ack_rate for t in rings]),
            ],
            label="publish, deliver and ack rates",
        ),
        "depth_chart": line_chart(
            [("ready", [t.ready for t in rings]), ("unacked", [t.unacked for t in rings])],
            label="messages ready and unacked",
        ),
        "memory_chart": line_chart(
            [("memory", [t.memory_bytes for t in rings])], label="engine memory"
        ),
    }


def _names(node: QueueEngine | None, who: Principal) -> list[str]:
    """The queue names offered as choices (dead-letter and move targets): those ``who``
    may see."""
    return [q.name for q in node.queues() if who.can_see(q.name)] if node is not None else []


@router.get("/", response_class=HTMLResponse)
async def overview(request: Request, login: LoginDep) -> HTMLResponse:
    return render(request, "overview.html", _overview_context(request, login), login)


@router.get("/fragments/overview", response_class=HTMLResponse)
async def overview_live(request: Request, login: LoginDep) -> HTMLResponse:
    return render(request, "_overview_live.html", _overview_context(request, login), login)


# --- queue list --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueueRow:
    info: QueueInfo
    stats: dict[str, object]
    configurable: bool


def _rows(
    request: Request, login: UiLogin, needle: str, sort: str = "name"
) -> tuple[list[QueueRow], int]:
    node = node_of(request)
    who = login.principal
    needle = needle.strip().lower()
    visible = [
        q for q in node.queues() if who.can_see(q.name) and (not needle or needle in q.name.lower())
    ]
    if sort == "depth":  # by the sampler's newest figures: no engine call per queue
        depth = {n: s.ready + s.unacked for n, s in store_of(request.app).latest()}
        visible.sort(key=lambda q: (-depth.get(q.name, 0), q.name))
    rows = []
    reads = reads_of(request.app)
    for info in visible[:ROWS_MAX]:
        try:
            stats = reads.stats(node, info.name, max_age_s=LIST_AGE_S)
        except QueueNotFound:
            continue
        rows.append(QueueRow(info, stats, can(who, "configure", info.name)))
    return rows, len(visible)


QueueFilter = Annotated[str, Query(max_length=200)]
QueueSort = Annotated[Literal["name", "depth"], Query()]


@router.get("/queues", response_class=HTMLResponse)
async def queues_page(
    request: Request, login: LoginDep, q: QueueFilter = "", sort: QueueSort = "name"
) -> HTMLResponse:
    try:
        rows, matching = _rows(request, login, q, sort)
    except QuorraError as e:
        return not_shown(request, login, e)
    context = {
        "rows": rows,
        "matching": matching,
        "rows_max": ROWS_MAX,
        "q": q,
        "sort": sort,
        "may_create": bool(login.principal.configure),
        "queue_names": _names(node_or_none(request.app.state), login.principal),
        "limits": settings_of(request.app.state).limits,
    }
    return render(request, "queues.html", context, login)


@router.get("/fragments/queues", response_class=HTMLResponse)
async def queue_rows(
    request: Request, login: LoginDep, q: QueueFilter = "", sort: QueueSort = "name"
) -> HTMLResponse:
    try:
        rows, matching = _rows(request, login, q, sort)
    except QuorraError as e:
        return flash(request, e.detail, kind="bad", status_code=e.status)
    context = {"rows": rows, "matching": matching, "rows_max": ROWS_MAX, "q": q, "sort": sort}
    return render(request, "_queue_rows.html", context, login)


# --- queue detail ------------------------------------------------------------------


def _info(request: Request, login: UiLogin, name: str) -> QueueInfo:
    """The queue, when the user may see it (else the same 404 as an unknown queue)."""
    for info in node_of(request).queues():
        if info.name == name and login.principal.can_see(name):
            return info
    raise QueueNotFound(f"no queue {name!r}")


def _series_charts(samples: list[Sample]) -> dict[str, object]:
    return {
        "depth_chart": line_chart(
            [("ready", [s.ready for s in samples]), ("unacked", [s.unacked for s in samples])],
            label="messages ready and unacked over time",
        ),
        "rates_chart": line_chart(
            [
                ("publish", [s.publish_rate for s in samples]),
                ("deliver", [s.deliver_rate for s in samples]),
                ("ack", [s.ack_rate for s in samples]),
            ],
            label="publish, deliver and ack rates over time",
        ),
        "memory_chart": line_chart(
            [("memory", [s.memory_bytes for s in samples])], label="engine memory of the queue"
        ),
    }


def _part(stats: Mapping[str, object], key: str) -> dict[str, object]:
    """A nested part of a queue's stats (``raft``, ``log``, ``checkpoint``,
    ``consumers``); empty when the stats have none."""
    part = stats.get(key)
    return part if isinstance(part, dict) else {}


def _live_context(request: Request, login: UiLogin, name: str) -> dict[str, object]:
    info = _info(request, login, name)
    node = node_of(request)
    stats = reads_of(request.app).stats(node, name)
    store = store_of(request.app)
    samples = store.queue(name)
    return {
        "info": info,
        "stats": stats,
        "raft": _part(stats, "raft"),
        "log": _part(stats, "log"),
        "checkpoint": _part(stats, "checkpoint"),
        "paging": _part(stats, "paging"),
        "read_cache": _part(stats, "read_cache") or {"reads": 0, "hit_rate": 1.0, "misses": 0},
        "consumers": sorted(_part(stats, "consumers").items()),
        **_series_charts(samples),
    }


async def _storage_context(request: Request, login: UiLogin, name: str) -> dict[str, object]:
    info = _info(request, login, name)
    node = node_of(request)
    reads = reads_of(request.app)
    settings = settings_of(request.app.state)
    here = settings.node_name
    deadline_s = settings.limits.leader_history_deadline_ms / 1000
    shown = await reads.segments_shown(node, name, here, deadline_s)
    segments = shown.segments
    history = await queue_history(
        node, db_of(request.app.state), name, info.uid, here, CHART_HISTORY_MAX
    )
    snapshots, compactions = history.snapshots, history.compactions
    widest = max((s.live_entries + s.dead_entries for s in segments), default=0)
    chart = history_chart(
        [(int(s.taken_at.timestamp() * 1000), s.bytes) for s in snapshots],
        [
            (int(c.started_at.timestamp() * 1000), max(0, c.bytes_before - c.bytes_after))
            for c in compactions
        ],
    )
    stats = reads.stats(node, name)
    return {
        "info": info,
        "segments": segments,
        "segments_shown": shown,
        "widest": widest,
        "snapshots": snapshots[:HISTORY_ROWS_SHOWN],
        "compactions": compactions[:HISTORY_ROWS_SHOWN],
        "history_chart": chart,
        "history": history,
        "log": _part(stats, "log"),
        "dead_per_100_live_max": settings_of(
            request.app.state
        ).limits.compaction_dead_per_100_live_max,
        "configurable": can(login.principal, "configure", name),
    }


def _dead_letter_sources(node: QueueEngine, name: str, who: Principal) -> list[str]:
    return sorted(
        q.name for q in node.queues() if q.args.dead_letter_queue == name and who.can_see(q.name)
    )


def not_shown(request: Request, login: UiLogin, error: QuorraError) -> HTMLResponse:
    """A page or fragment that cannot be shown: the error page, with the error's status."""
    return render(request, "error.html", {"message": error.detail}, login, error.status)


@router.get("/queues/{name}", response_class=HTMLResponse)
async def queue_page(name: QueueName, request: Request, login: LoginDep) -> HTMLResponse:
    try:
        return await _queue_page(name, request, login)
    except QuorraError as e:
        return not_shown(request, login, e)


async def _queue_page(name: str, request: Request, login: UiLogin) -> HTMLResponse:
    who = login.principal
    context = {
        **_live_context(request, login, name),
        **await _storage_context(request, login, name),
        "may_configure": can(who, "configure", name),
        "may_write": can(who, "write", name),
        "may_read": can(who, "read", name),
        "redrive_targets": _dead_letter_sources(node_of(request), name, who),
        "queue_names": _names(node_or_none(request.app.state), who),
        "analytics": await anyio.to_thread.run_sync(_analytics, request, name),
    }
    if context["may_read"]:
        context |= await _browse_context(request, name, None)
    return render(request, "queue.html", context, login)


@router.get("/queues/{name}/live", response_class=HTMLResponse)
async def queue_live(name: QueueName, request: Request, login: LoginDep) -> HTMLResponse:
    try:
        context = _live_context(request, login, name)
    except QuorraError as e:
        return flash(request, e.detail, kind="bad", status_code=e.status)
    return render(request, "_queue_live.html", context, login)


@router.get("/queues/{name}/storage", response_class=HTMLResponse)
async def queue_storage(name: QueueName, request: Request, login: LoginDep) -> HTMLResponse:
    try:
        context = await _storage_context(request, login, name)
    except QuorraError as e:
        return flash(request, e.detail, kind="bad", status_code=e.status)
    return render(request, "_queue_storage.html", context, login)


# --- browsing ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ShownMessage:
    message: BrowsedMessage
    kind: str
    """``json``, ``text`` or ``binary``."""
    text: str
    truncated: bool


def decode_body(body: bytes) -> tuple[str, str]:
    """How to show a body: pretty JSON, text, or a hex dump of binary data."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return "binary", body[: BODY_CHARS_SHOWN // 3].hex(" ")
    try:
        return "json", json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except ValueError:
        return "text", text


def shown(message: BrowsedMessage) -> ShownMessage:
    kind, text = decode_body(message.body)
    return ShownMessage(message, kind, text[:BODY_CHARS_SHOWN], len(text) > BODY_CHARS_SHOWN)


async def _browse_context(request: Request, name: str, after: int | None) -> dict[str, object]:
    browsed = await node_of(request).browse(name, after=after, limit=BROWSE_LIMIT)
    return {
        "messages": [shown(m) for m in browsed],
        "after": after,
        "next_after": browsed[-1].cursor if len(browsed) == BROWSE_LIMIT else None,
    }


@router.get("/queues/{name}/messages", response_class=HTMLResponse)
async def queue_messages(
    name: QueueName,
    request: Request,
    login: LoginDep,
    after: Annotated[int | None, Query(ge=0, le=1 << 62)] = None,
) -> HTMLResponse:
    try:
        info = _info(request, login, name)
        if not can(login.principal, "read", name):
            context = {"info": info, "may_read": False, "messages": []}
            return render(request, "_messages.html", context, login, 403)
        context = {"info": info, "may_read": True, **await _browse_context(request, name, after)}
    except QuorraError as e:
        return flash(request, e.detail, kind="bad", status_code=e.status)
    return render(request, "_messages.html", context, login)


def _analytics(request: Request, name: str) -> dict[str, object] | None:
    """The pipeline's analytics summary of this queue, when ``quorra pipeline report
    --out DATA_DIR/reports`` wrote one (``reports/<queue>/summary.json``). File I/O:
    call it on a worker thread."""
    if name in UNADDRESSABLE_QUEUE_NAMES:
        return None
    path = settings_of(request.app.state).data_dir / ANALYTICS_DIR / name / "summary.json"
    try:
        if path.stat().st_size > ANALYTICS_BYTES_MAX:
            return None
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) else None
