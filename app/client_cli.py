"""``quorra user add``, ``quorra token create``, ``quorra publish`` and ``quorra consume``.

``user`` and ``token`` work on the local data directory's metadata database directly
(as ``rabbitmqctl`` does), so they work before the first ``quorra serve`` and while it
runs (SQLite in WAL mode); they are audited with source ``cli``. ``publish`` and
``consume`` are clients of the server through ``quorra.client``, with a bearer token from
``--token`` or ``QUORRA_TOKEN``: ``publish`` streams (one WebSocket, frames of
``--batch`` lines, as many unconfirmed as the server's window takes), ``consume``
receives and acks over REST (its ``--wait-ms`` is the receive's long-poll):

    TOKEN=$(quorra token create --user admin)
    seq 1 1000 | quorra publish orders --token "$TOKEN"
    quorra consume orders --token "$TOKEN" --max 1000 > out.txt

On a terminal they draw a progress bar with the rate on stderr (``show_progress`` says
when). The HTTP helpers here (``api_client``, ``send``, ``run_action``) serve the queue
commands of ``app.queue_cli`` too.
"""

from __future__ import annotations

import secrets
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    import httpx
    from rich.console import Console
    from rich.progress import Progress

    from app.db.session import Database
    from quorra.client import Client, Message, Problem, Stream

DEFAULT_URL = "http://127.0.0.1:8000"
RETRY_STATUSES = frozenset({429, 503})
RETRIES_MAX = 30
RETRY_AFTER_S_MAX = 30.0
PROGRESS_AFTER_MESSAGES = 1000
"""Runs shorter than this show no progress bar."""

DataDir = Annotated[Path, typer.Option(help="The server's data directory.")]
Url = Annotated[str, typer.Option(envvar="QUORRA_URL", help="Base URL of the server.")]
Token = Annotated[str, typer.Option(envvar="QUORRA_TOKEN", help="API token (or QUORRA_TOKEN).")]


def stderr() -> Console:
    """The console on stderr. rich loads when a command first writes (``quorra serve``,
    which imports this module, never does: ~20 ms of its start)."""
    from app.console import stderr_console

    return stderr_console()


class ClientError(Exception):
    """An answer the client cannot go on from; its text is shown to the user."""


# --- local metadata commands -------------------------------------------------------


def _local_database(data_dir: Path) -> Database:
    from app.db.migrate import upgrade_to_head
    from app.db.session import Database
    from app.settings import Settings

    settings = Settings(data_dir=data_dir.resolve())
    if not settings.data_dir.is_dir():
        raise ClientError(f"no data directory at {settings.data_dir}")
    db = Database(settings.database_url)
    upgrade_to_head(db.engine, settings.migrations_dir)
    return db


def add_user(
    data_dir: Path, name: str, password: str, role: str, configure: str, write: str, read: str
) -> None:
    from app.auth import hash_password, pattern_error
    from app.db import repo

    for label, pattern in (("configure", configure), ("write", write), ("read", read)):
        if (error := pattern_error(pattern)) is not None:
            raise ClientError(f"--{label}: {error}")
    db = _local_database(data_dir)
    try:
        with db.transaction() as session:
            if repo.get_user(session, name) is not None:
                raise ClientError(f"user {name!r} exists")
            repo.create_user(
                session,
                name=name,
                password_hash=hash_password(password),
                role=role,
                configure=configure,
                write=write,
                read=read,
            )
            detail = {
                "role": role,
                "permissions": {"configure": configure, "write": write, "read": read},
            }
            repo.audit(
                session, actor="cli", action="user.create", target=name, detail=detail, source="cli"
            )
    finally:
        db.dispose()


def create_token(data_dir: Path, user_name: str, label: str) -> str:
    from app.api.tokens import issue_token
    from app.db import repo

    db = _local_database(data_dir)
    try:
        with db.transaction() as session:
            user = repo.get_user(session, user_name)
            if user is None:
                raise ClientError(f"no user {user_name!r}")
            secret, row = issue_token(session, user, label)
            detail = {"token_id": row.id, "name": label}
            repo.audit(
                session,
                actor="cli",
                action="token.create",
                target=user_name,
                detail=detail,
                source="cli",
            )
            return secret
    finally:
        db.dispose()


# --- HTTP client -------------------------------------------------------------------


def _problem_text(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return f"HTTP {response.status_code}"
    if isinstance(body, dict) and "title" in body:
        detail = f": {body['detail']}" if body.get("detail") else ""
        return f"{body['title']} (HTTP {response.status_code}){detail}"
    return f"HTTP {response.status_code}"


def _retry_after_s(response: httpx.Response) -> float:
    try:
        return min(float(response.headers.get("retry-after", "1")), RETRY_AFTER_S_MAX)
    except ValueError:
        return 1.0


def send(
    client: httpx.Client,
    method: str,
    path: str,
    body: Mapping[str, object] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> httpx.Response:
    """Send one request and return its successful answer; wait and retry on 429/503 as
    ``Retry-After`` says (the server did nothing then); any other error is a
    ``ClientError`` with the problem's title and detail."""
    for _ in range(RETRIES_MAX):
        response = client.request(method, path, json=body)
        if response.status_code in RETRY_STATUSES:
            sleep(_retry_after_s(response))
            continue
        if response.is_error:
            raise ClientError(_problem_text(response))
        return response
    raise ClientError(f"gave up on {path} after {RETRIES_MAX} retries")


def call(
    client: httpx.Client,
    path: str,
    body: Mapping[str, object],
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """POST ``body`` and return the JSON object the server answers with."""
    response = send(client, "POST", path, body, sleep)
    result = response.json() if response.content else {}
    if not isinstance(result, dict):
        raise ClientError(f"unexpected answer from {path}")
    return result


def _batches(lines: Iterable[str], size: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for line in lines:
        batch.append(line.rstrip("\r\n"))
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def problem_text(problem: Problem) -> str:
    detail = f": {problem.detail}" if problem.detail else ""
    return f"{problem.title} (HTTP {problem.status}){detail}"


def _retry_after(problem: Problem) -> float:
    value = problem.extra.get("retry_after_s")
    return min(float(value), RETRY_AFTER_S_MAX) if isinstance(value, int | float) else 1.0


def _answered(
    stream: Stream,
    sent: dict[int, list[Message]],
    sleep: Callable[[float], None],
    retries: dict[int, int],
) -> int:
    """Messages of ``sent`` confirmed since the last call (forgotten then); a publish
    refused with 429/503 is sent again after its ``Retry-After``, any other refusal is a
    ``ClientError``."""
    confirmed = 0
    for seq in [seq for seq in sent if stream.ledger.done(seq)]:
        messages = sent.pop(seq)
        problem = stream.ledger.failures.pop(seq, None)
        if problem is None:
            confirmed += len(messages)
            continue
        tries = retries.pop(seq, 0) + 1
        if problem.status not in RETRY_STATUSES:
            raise ClientError(problem_text(problem))
        if tries >= RETRIES_MAX:
            raise ClientError(f"gave up after {RETRIES_MAX} retries: {problem_text(problem)}")
        sleep(_retry_after(problem))
        again = stream.publish(list(messages))
        sent[again], retries[again] = messages, tries
    return confirmed


def publish_lines(
    stream: Stream,
    lines: Iterable[str],
    batch_size: int,
    on_progress: Callable[[int], None] = lambda n: None,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Publish one message per line over a stream, ``batch_size`` per frame, as many
    frames unconfirmed as the stream's window takes; returns the count once every one
    is confirmed (durable). Progress counts confirmed messages.

    Each message carries a ``dedup_id`` unique to this run, so a frame sent again after
    a 503 (whose outcome the server could not know) is not published twice (within the
    server's dedup window).
    """
    from quorra.client import Message

    run = secrets.token_hex(6)
    numbered = 0
    published = 0
    sent: dict[int, list[Message]] = {}
    retries: dict[int, int] = {}
    for batch in _batches(lines, batch_size):
        messages = [
            Message(body.encode("utf-8"), dedup_id=f"{run}-{numbered + i}")
            for i, body in enumerate(batch)
        ]
        numbered += len(batch)
        sent[stream.publish(list(messages))] = messages
        done = _answered(stream, sent, sleep, retries)
        published += done
        if done:
            on_progress(done)
    while sent:
        if not any(stream.ledger.done(seq) for seq in sent):
            stream.read(None)
            continue
        done = _answered(stream, sent, sleep, retries)
        published += done
        if done:
            on_progress(done)
    return published


def consume_lines(
    client: Client,
    queue: str,
    out: IO[bytes],
    max_messages: int,
    batch_size: int,
    wait_ms: int,
    follow: bool,
    on_progress: Callable[[int], None] = lambda n: None,
) -> int:
    """Receive, write one line per message, then ack (at-least-once); returns the count.

    Stops after ``max_messages`` (0: no limit) or, unless ``follow``, at the first
    receive that comes back empty.
    """
    consumed = 0
    while max_messages == 0 or consumed < max_messages:
        want = batch_size if max_messages == 0 else min(batch_size, max_messages - consumed)
        messages = client.receive(queue, max_messages=want, wait_ms=wait_ms)
        if not messages:
            if follow:
                continue
            break
        for message in messages:
            out.write(message.body + b"\n")
        out.flush()
        client.ack(queue, [m.receipt for m in messages])
        consumed += len(messages)
        on_progress(len(messages))
    return consumed


def _token(token: str) -> str:
    if not token:
        raise ClientError(
            "no token: pass --token or set QUORRA_TOKEN (quorra token create makes one)"
        )
    return token


def api_client(url: str, token: str) -> httpx.Client:
    """A client of the REST API at ``url`` with the bearer ``token`` (required)."""
    if not token:
        raise ClientError(
            "no token: pass --token or set QUORRA_TOKEN (quorra token create makes one)"
        )
    import httpx  # here, not at the top: ``quorra serve`` loads this module (~65 ms)

    headers = {"Authorization": f"Bearer {token}", "User-Agent": "quorra-cli"}
    return httpx.Client(base_url=url, headers=headers, timeout=httpx.Timeout(60.0))


def show_progress(stderr_tty: bool, data_tty: bool) -> bool:
    """Whether a command draws a progress bar (on stderr): only when stderr is a terminal,
    and not when the command's data also flows through a terminal (``consume`` printing
    to the screen, ``publish`` reading what is typed), whose lines the bar would garble.
    Piped or redirected, a command prints no bar."""
    return stderr_tty and not data_tty


def _progress(label: str, show: bool) -> AbstractContextManager[Progress | None]:
    """A progress bar on stderr, or nothing when ``show`` is false."""
    if not show:
        return nullcontext(None)
    from app.console import progress_bar

    return progress_bar(label)


def run_action(action: Callable[[], None]) -> None:
    """Run a command's body; a ``ClientError`` or a transport error is one line on stderr
    and exit status 1."""
    import httpx
    from websockets.exceptions import WebSocketException

    from quorra.client import Problem, PublishFailed

    try:
        action()
    except Problem as e:
        stderr().print(f"[red]error:[/red] {problem_text(e)}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    except PublishFailed as e:
        text = problem_text(next(iter(e.failures.values())))
        stderr().print(f"[red]error:[/red] {text}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    except ClientError as e:
        stderr().print(f"[red]error:[/red] {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    except (httpx.HTTPError, OSError, WebSocketException) as e:  # refused, reset, timed out
        stderr().print(
            f"[red]error:[/red] {type(e).__name__}: {e}", highlight=False, soft_wrap=True
        )
        raise typer.Exit(1) from None


# --- commands ------------------------------------------------------------------------


def register(cli: typer.Typer) -> None:
    user_cli = typer.Typer(help="Users in the local data directory.", no_args_is_help=True)
    token_cli = typer.Typer(help="API tokens in the local data directory.", no_args_is_help=True)
    cli.add_typer(user_cli, name="user")
    cli.add_typer(token_cli, name="token")

    @user_cli.command("add")
    def user_add(
        name: Annotated[str, typer.Argument(help="User name.")],
        password: Annotated[
            str,
            typer.Option(prompt=True, hide_input=True, confirmation_prompt=True, help="Password."),
        ],
        role: Annotated[str, typer.Option(help="admin or user.")] = "user",
        configure: Annotated[
            str, typer.Option(help="Regex of queues to create/delete/purge.")
        ] = "",
        write: Annotated[str, typer.Option(help="Regex of queues to publish to.")] = "",
        read: Annotated[str, typer.Option(help="Regex of queues to consume from.")] = "",
        data_dir: DataDir = Path("./data"),
    ) -> None:
        """Add a user (permissions are RabbitMQ-style regexes; empty permits nothing)."""
        if role not in ("admin", "user"):
            raise typer.BadParameter("admin or user", param_hint="--role")
        if len(password) < 8:
            raise typer.BadParameter("at least 8 characters", param_hint="--password")
        run_action(lambda: add_user(data_dir, name, password, role, configure, write, read))
        stderr().print(f"added user {name!r} ({role})")

    @token_cli.command("create")
    def token_create(
        user: Annotated[str, typer.Option(help="The token's user.")] = "admin",
        name: Annotated[str, typer.Option(help="A label for the token.")] = "",
        data_dir: DataDir = Path("./data"),
    ) -> None:
        """Create an API token and print it (only now) on stdout."""
        run_action(lambda: print(create_token(data_dir, user, name)))

    @cli.command()
    def publish(
        queue: Annotated[str, typer.Argument(help="Queue name.")],
        url: Url = DEFAULT_URL,
        token: Token = "",
        batch: Annotated[int, typer.Option(min=1, max=1000, help="Messages per request.")] = 100,
        file: Annotated[
            Path | None, typer.Option(help="Read lines from this file, not stdin.")
        ] = None,
    ) -> None:
        """Publish each line of stdin (or --file) as one message."""

        def action() -> None:
            show = show_progress(stderr().is_terminal, file is None and sys.stdin.isatty())
            source = sys.stdin if file is None else file.open(encoding="utf-8")
            from quorra.client import Stream

            stream = Stream(url, _token(token), queue)
            with source, stream, _progress("publishing", show) as bar:
                task = bar.add_task("publish", total=None) if bar else None
                count = publish_lines(
                    stream,
                    source,
                    batch,
                    lambda n: bar.advance(task, n) if bar and task is not None else None,
                )
            stderr().print(f"published {count} messages to {queue!r}")

        run_action(action)

    @cli.command()
    def consume(
        queue: Annotated[str, typer.Argument(help="Queue name.")],
        url: Url = DEFAULT_URL,
        token: Token = "",
        max_messages: Annotated[
            int, typer.Option("--max", min=0, help="Stop after this many (0: no limit).")
        ] = 0,
        batch: Annotated[int, typer.Option(min=1, max=1000, help="Messages per receive.")] = 100,
        wait_ms: Annotated[
            int, typer.Option(min=0, max=20000, help="Long-poll wait per receive.")
        ] = 1000,
        follow: Annotated[bool, typer.Option(help="Keep waiting when the queue is empty.")] = False,
    ) -> None:
        """Print one message per line on stdout and ack it once written."""

        def action() -> None:
            show = show_progress(stderr().is_terminal, sys.stdout.isatty()) and (
                max_messages == 0 or max_messages >= PROGRESS_AFTER_MESSAGES
            )
            from quorra.client import Client

            client = Client(url, _token(token), retries=RETRIES_MAX)
            with client, _progress("consuming", show) as bar:
                task = bar.add_task("consume", total=max_messages or None) if bar else None
                count = consume_lines(
                    client,
                    queue,
                    sys.stdout.buffer,
                    max_messages,
                    batch,
                    wait_ms,
                    follow,
                    lambda n: bar.advance(task, n) if bar and task is not None else None,
                )
            stderr().print(f"consumed {count} messages from {queue!r}")

        run_action(action)
