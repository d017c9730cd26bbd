"""Dashboard actions on queues. Each checks the session's CSRF token and the user's
permission (403 otherwise, whatever the page showed), then calls the same functions as
the REST API: ``app.queue_admin`` for create, delete, purge, snapshot and compaction
(engine first, then SQLite and the audit log), the engine's ``publish`` with the
REST API's own message checks, and ``receive``/``publish``/``ack`` for a redrive.

Answers are flash fragments (see app/ui/common.py); a success also sends
``HX-Trigger: quorra:tick, quorra:changed`` so the page's live parts (and the
message browser, which does not poll) refresh at once.
"""

from __future__ import annotations

import json

import anyio
from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse
from pydantic import ValidationError
from starlette.datastructures import FormData

from app import queue_admin
from app.api.deps import QueueName, client_addr
from app.api.message_bodies import publish_messages
from app.api.queue_schemas import QueueArgsIn
from app.auth import Permission, Principal, require, require_flow
from app.db import repo
from app.db.session import Database
from app.names import check_queue_name
from app.problems import AppProblem
from app.state import db_of, settings_of
from app.ui.common import actor_of, error_flash, flash, node_of
from app.ui.reads import reads_of
from app.ui.views import CsrfLoginDep
from engine.errors import QuorraError, ValidationFailed
from engine.limits import Limits
from engine.runtime.api import CompactionPhase, OutgoingMessage, QueueArgs

router = APIRouter(include_in_schema=False)

REDRIVE_MESSAGES_MAX = 1000
REDRIVE_LEASE_MS = 60_000
REDRIVE_CONSUMER = "dashboard-redrive"
HEADER_LINES_MAX = 64

OPTIONAL_INTS = ("replicas", "max_length", "max_bytes", "message_ttl_ms")
DEFAULTED_INTS = ("priorities", "lease_ms", "max_message_bytes")


def done(
    request: Request, message: str, *, queue: str, redirect: str | None = None
) -> HTMLResponse:
    reads_of(request.app).forget(queue)
    response = flash(request, message)
    response.headers["HX-Trigger"] = "quorra:tick, quorra:changed"
    if redirect is not None:
        response.headers["HX-Redirect"] = redirect
    return response


def _permit(who: Principal, permission: Permission, name: str) -> None:
    require(who, permission, name)


def _int_field(form: FormData, key: str) -> int | str | None:
    """A form's number as the API's JSON would carry it (text stays text: 422 later)."""
    raw = str(form.get(key, "")).strip()
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        return raw


def queue_args_in(form: FormData, limits: Limits) -> QueueArgsIn:
    """The create form as ``PUT /queues/{name}``'s body; pydantic validates it the same.
    An empty field takes this node's default."""
    body: dict[str, object] = {
        "overflow": str(form.get("overflow", "reject-publish")),
        "lease_ms": limits.lease_ms_default,
        "max_message_bytes": limits.message_bytes_max,
        "delivery_limit": limits.delivery_limit_default,
    }
    for key in OPTIONAL_INTS + DEFAULTED_INTS:
        value = _int_field(form, key)
        if value is not None:
            body[key] = value
    if form.get("delivery_unlimited"):
        body["delivery_limit"] = None
    elif (limit := _int_field(form, "delivery_limit")) is not None:
        body["delivery_limit"] = limit
    dead_letter = str(form.get("dead_letter_queue", "")).strip()
    if dead_letter:
        body["dead_letter_queue"] = dead_letter
    return QueueArgsIn.model_validate(body)


@router.post("/queues", response_class=HTMLResponse)
async def create_queue(request: Request, login: CsrfLoginDep) -> HTMLResponse:
    form = await request.form()
    name = str(form.get("name", "")).strip()
    try:
        check_queue_name(name)
        _permit(login.principal, "configure", name)
        args_in = queue_args_in(form, settings_of(request.app.state).limits)
        queue_admin.check_dead_letter_target(login.principal, name, args_in.dead_letter_queue)
        node = node_of(request)
        args = QueueArgs(**args_in.model_dump())
        _info, created = await queue_admin.create_queue(
            node, _db(request), actor_of(request, login), name, args
        )
    except (QuorraError, AppProblem, ValidationError) as e:
        return error_flash(request, e)
    said = "created" if created else "exists already with these arguments"
    return done(request, f"Queue {name} {said}.", queue=name, redirect=f"/queues/{name}")


def _db(request: Request) -> Database:
    return db_of(request.app.state)


@router.post("/queues/{name}/delete", response_class=HTMLResponse)
async def delete_queue(name: QueueName, request: Request, login: CsrfLoginDep) -> HTMLResponse:
    try:
        _permit(login.principal, "configure", name)
        await queue_admin.delete_queue(
            node_of(request), _db(request), actor_of(request, login), name
        )
    except (QuorraError, AppProblem) as e:
        return error_flash(request, e)
    return done(request, f"Queue {name} deleted.", queue=name, redirect="/queues")


@router.post("/queues/{name}/purge", response_class=HTMLResponse)
async def purge_queue(name: QueueName, request: Request, login: CsrfLoginDep) -> HTMLResponse:
    try:
        _permit(login.principal, "configure", name)
        purged = await queue_admin.purge_queue(
            node_of(request), _db(request), actor_of(request, login), name
        )
    except (QuorraError, AppProblem) as e:
        return error_flash(request, e)
    return done(request, f"Purged {purged} ready messages from {name}.", queue=name)


@router.post("/queues/{name}/snapshot", response_class=HTMLResponse)
async def take_snapshot(name: QueueName, request: Request, login: CsrfLoginDep) -> HTMLResponse:
    try:
        _permit(login.principal, "configure", name)
        record = await queue_admin.take_checkpoint(
            node_of(request), _db(request), actor_of(request, login), name
        )
    except (QuorraError, AppProblem) as e:
        return error_flash(request, e)
    return done(
        request,
        f"Snapshot of {name} taken at index {record.index}: {record.bytes} bytes, "
        f"{record.live_entries} live entries, {record.duration_ms:.1f} ms.",
        queue=name,
    )


def _phase(raw: str) -> CompactionPhase:
    if raw == "auto":
        return "auto"
    if raw == "1":
        return 1
    if raw == "2":
        return 2
    if raw == "3":
        return 3
    raise ValidationFailed("phase is auto, 1, 2 or 3")


@router.post("/queues/{name}/compact", response_class=HTMLResponse)
async def compact(name: QueueName, request: Request, login: CsrfLoginDep) -> HTMLResponse:
    form = await request.form()
    try:
        _permit(login.principal, "configure", name)
        phase = _phase(str(form.get("phase", "auto")))
        record = await queue_admin.run_compaction(
            node_of(request), _db(request), actor_of(request, login), name, phase
        )
    except (QuorraError, AppProblem) as e:
        return error_flash(request, e)
    if record.phase == "none":
        return done(
            request, f"Compaction of {name} found nothing to reclaim (phase {phase}).", queue=name
        )
    return done(
        request,
        f"Compaction of {name} ran phase {record.phase}: segments {record.segments_before} → "
        f"{record.segments_after}, {record.bytes_before} → {record.bytes_after} bytes, "
        f"{record.duration_ms:.1f} ms.",
        queue=name,
    )


def parse_headers(text: str) -> dict[str, str]:
    """``key: value`` per line (or a JSON object)."""
    text = text.strip()
    if not text:
        return {}
    if text.startswith("{"):
        try:
            loaded = json.loads(text)
        except ValueError:
            raise ValidationFailed("headers: not a JSON object") from None
        if not isinstance(loaded, dict) or not all(isinstance(v, str) for v in loaded.values()):
            raise ValidationFailed("headers: a JSON object of strings")
        return {str(k): v for k, v in loaded.items()}
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) > HEADER_LINES_MAX:
        raise ValidationFailed(f"headers: at most {HEADER_LINES_MAX} lines")
    headers = {}
    for line in lines:
        key, sep, value = line.partition(":")
        if not sep or not key.strip():
            raise ValidationFailed(f"headers: {line[:40]!r} is not 'key: value'")
        headers[key.strip()] = value.strip()
    return headers


@router.post("/queues/{name}/publish", response_class=HTMLResponse)
async def publish(name: QueueName, request: Request, login: CsrfLoginDep) -> HTMLResponse:
    form = await request.form()
    try:
        _permit(login.principal, "write", name)
        message: dict[str, object] = {
            "body": str(form.get("body", "")),
            "headers": parse_headers(str(form.get("headers", ""))),
        }
        if (priority := _int_field(form, "priority")) is not None:
            message["priority"] = priority
        batch = publish_messages({"messages": [message]}, settings_of(request.app.state).limits)
        ids = await node_of(request).publish(name, batch)
    except (QuorraError, AppProblem, ValidationError, RequestValidationError) as e:
        return error_flash(request, e)
    return done(request, f"Published message {ids[0]} to {name}.", queue=name)


@router.post("/queues/{name}/redrive", response_class=HTMLResponse)
async def redrive(name: QueueName, request: Request, login: CsrfLoginDep) -> HTMLResponse:
    """Move up to ``count`` ready messages of ``name`` (a dead-letter queue) to ``target``
    (``configure`` and ``read`` on ``name``, ``write`` on ``target``): lease them, publish
    copies to the target (durable there first), then ack them here. A failed publish
    gives the leases back, so a message is never lost (it may be published twice if the
    ack fails: at least once, like every delivery)."""
    form = await request.form()
    target = str(form.get("target", "")).strip()
    try:
        _permit(login.principal, "configure", name)
        check_queue_name(target)
        require_flow(login.principal, name, target)
        if target == name:
            raise ValidationFailed("choose another queue to move messages to")
        count = _int_field(form, "count") or 100
        if not isinstance(count, int) or not 1 <= count <= REDRIVE_MESSAGES_MAX:
            raise ValidationFailed(f"count is 1 to {REDRIVE_MESSAGES_MAX}")
        moved = await _move(request, name, target, count)
        await _audit_redrive(request, login.principal.name, name, target, moved)
    except (QuorraError, AppProblem) as e:
        return error_flash(request, e)
    reads_of(request.app).forget(target)
    return done(request, f"Moved {moved} messages from {name} to {target}.", queue=name)


async def _move(request: Request, source: str, target: str, count: int) -> int:
    node = node_of(request)
    received = await node.receive(
        source,
        consumer=REDRIVE_CONSUMER,
        max_messages=count,
        wait_ms=0,
        lease_ms=REDRIVE_LEASE_MS,
    )
    if not received:
        return 0
    receipts = [m.receipt for m in received]
    copies = [
        OutgoingMessage(m.body, {**m.headers, "x-redriven-from": source}, m.priority)
        for m in received
    ]
    try:
        await node.publish(target, copies)
    except QuorraError:
        await node.nack(source, receipts, requeue=True)
        raise
    result = await node.ack(source, receipts)
    return result.settled


async def _audit_redrive(
    request: Request, actor: str, source: str, target: str, moved: int
) -> None:
    def write() -> None:
        with _db(request).transaction() as session:
            repo.audit(
                session,
                actor=actor,
                action="queue.redrive",
                target=source,
                detail={"to": target, "moved": moved},
                source="ui",
                remote_addr=client_addr(request),
            )

    await anyio.to_thread.run_sync(write)
