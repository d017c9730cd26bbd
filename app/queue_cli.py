"""``quorra queue list|show|create|delete|purge|snapshot|compact`` and ``quorra status``:
an operator's view of a server over the REST API (API.md), as ``rabbitmqadmin`` and
``aws sqs`` give one.

Every command is an HTTP client with ``--url``/``QUORRA_URL`` and ``--token``/
``QUORRA_TOKEN``, as ``publish`` is (``app.client_cli``). Human output is rich tables and
sentences on stdout; ``--json`` prints the server's own JSON instead, for scripts. A
problem from the server is one line on stderr (its title and detail) and exit status 1.
``queue delete`` asks first, unless ``--yes``; without a terminal to ask on it refuses.
``status`` needs no token for health and readiness (open endpoints); with one it adds
the nodes, the queue count and the WAL's sync times, the dashboard overview's figures,
read from ``/metrics``. It exits 1 unless the node is up and ready.

    quorra queue create orders --max-length 100000 --dead-letter-queue orders.dead
    quorra queue list
    quorra queue delete orders --yes
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, TypedDict
from urllib.parse import quote

import typer

if TYPE_CHECKING:
    import httpx
    from rich.console import Console
    from rich.table import Table

from app.client_cli import (
    DEFAULT_URL,
    ClientError,
    Token,
    Url,
    api_client,
    run_action,
    send,
    stderr,
)
from app.ui.charts import NONE, human_bytes, human_count, human_rate

Json = Annotated[bool, typer.Option("--json", help="Print the server's JSON (for scripts).")]
QueueName = Annotated[str, typer.Argument(help="Queue name.")]
STATUS_TIMEOUT_S = 5.0


class Overflow(StrEnum):
    reject_publish = "reject-publish"
    drop_head = "drop-head"


class Phase(StrEnum):
    auto = "auto"
    one = "1"
    two = "2"
    three = "3"


def _queue_path(name: str, tail: str = "") -> str:
    return f"/api/v1/queues/{quote(name, safe='')}{tail}"


def _stdout() -> Console:
    from rich.console import Console  # here: ``quorra serve`` loads this module, not rich

    return Console(highlight=False)


def _say(text: str) -> None:
    """One sentence on stdout, unwrapped (a script may grep it)."""
    _stdout().print(text, soft_wrap=True)


def _print_json(value: object) -> None:
    print(json.dumps(value, indent=2))


def stdin_is_terminal() -> bool:
    return sys.stdin.isatty()


def _with_client(url: str, token: str, work: Callable[[httpx.Client], None]) -> None:
    def action() -> None:
        with api_client(url, token) as client:
            work(client)

    run_action(action)


def _request_and_print(
    url: str,
    token: str,
    as_json: bool,
    method: str,
    path: str,
    human: Callable[[Any], Table | str],
    body: dict[str, object] | None = None,
) -> None:
    """Send a request and print the answer's JSON: as it is with ``--json``, else as
    ``human`` tells it (a table, or a sentence)."""

    def work(client: httpx.Client) -> None:
        answer = send(client, method, path, body).json()
        if as_json:
            _print_json(answer)
        elif isinstance(told := human(answer), str):
            _say(told)
        else:
            _stdout().print(told)

    _with_client(url, token, work)


# --- human output ------------------------------------------------------------------


def queue_table(queues: list[dict[str, Any]]) -> Table:
    """``queue list``: one row per queue."""
    from rich.table import Table

    table = Table(box=None, pad_edge=False)
    table.add_column("Name", overflow="fold")
    for heading in ("Ready", "Unacked", "Publish", "Deliver", "Ack", "Memory"):
        table.add_column(heading, justify="right", no_wrap=True)
    table.add_column("Leader", no_wrap=True)
    for queue in queues:
        stats = queue.get("stats", {})
        table.add_row(
            queue["name"],
            human_count(stats.get("messages_ready")),
            human_count(stats.get("messages_unacked")),
            human_rate(stats.get("publish_rate")),
            human_rate(stats.get("deliver_rate")),
            human_rate(stats.get("ack_rate")),
            human_bytes(stats.get("memory_bytes")),
            str(stats.get("raft", {}).get("leader") or NONE),
        )
    return table


def _facts(rows: list[tuple[str, str]]) -> Table:
    from rich.table import Table

    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    for key, value in rows:
        table.add_row(key, value)
    return table


def queue_facts(queue: dict[str, Any]) -> Table:
    """``queue show``: the definition, then the stats an operator reads first."""
    stats = queue.get("stats", {})
    raft, log, checkpoint = (stats.get(k, {}) for k in ("raft", "log", "checkpoint"))
    arguments = ", ".join(
        f"{k}={v}" for k, v in queue.get("arguments", {}).items() if v is not None
    )
    members = ", ".join(
        f"{m['node']} ({m['role']}, lag {m['lag']})" for m in raft.get("members", [])
    )
    rates = (stats.get("publish_rate"), stats.get("deliver_rate"), stats.get("ack_rate"))
    return _facts(
        [
            ("Name", queue["name"]),
            ("Created", str(queue.get("created_at", NONE))),
            ("Arguments", arguments),
            ("Status", str(stats.get("status", NONE))),
            (
                "Messages",
                f"{human_count(stats.get('messages_ready'))} ready "
                f"({human_bytes(stats.get('bytes_ready'))}), "
                f"{human_count(stats.get('messages_unacked'))} unacked, "
                f"{human_count(stats.get('messages_delayed'))} delayed",
            ),
            ("Consumers", human_count(len(stats.get("consumers", {})))),
            ("Rates", "publish {} · deliver {} · ack {}".format(*map(human_rate, rates))),
            (
                "Memory",
                f"{human_bytes(stats.get('memory_bytes'))} "
                f"({stats.get('memory_per_message_bytes', 0):.1f} B per message)",
            ),
            (
                "Raft",
                f"leader {raft.get('leader') or NONE}, term {raft.get('term')}, "
                f"commit {raft.get('commit_index')}, applied {raft.get('last_applied')}",
            ),
            ("Members", members or NONE),
            (
                "Log",
                f"{log.get('first_index')}..{log.get('last_index')}, "
                f"{log.get('segments')} segments, {human_bytes(log.get('bytes'))}, "
                f"{log.get('live_entries')} live / {log.get('dead_entries')} dead entries",
            ),
            (
                "Checkpoint",
                f"index {checkpoint.get('index')}, {human_bytes(checkpoint.get('bytes'))}, "
                f"taken {checkpoint.get('taken_at') or NONE}",
            ),
        ]
    )


def create_body(**options: object) -> dict[str, object]:
    """The ``PUT /queues/{name}`` body: only the options given, so the server's defaults
    hold for the rest. ``delivery_limit`` 0 means unlimited (``null``)."""
    body = {
        k: v.value if isinstance(v, StrEnum) else v for k, v in options.items() if v is not None
    }
    if body.get("delivery_limit") == 0:
        body["delivery_limit"] = None
    return body


# --- status ------------------------------------------------------------------------


class WalFigures(TypedDict):
    """The WAL's sync times, as ``/metrics`` tells them."""

    syncs: int
    sync_mean_ms: float | None
    recent_syncs: int
    recent_p50_ms: float | None
    recent_p99_ms: float | None
    recent_max_ms: float | None


class MetricsFigures(TypedDict):
    queues: int | None
    wal: WalFigures | None


class ServerStatus(TypedDict):
    """``quorra status``'s figures (``--json`` prints them as they are)."""

    url: str
    healthy: bool
    readiness: dict[str, object] | None
    """``/readyz``'s JSON; ``node`` and ``nodes`` are ``/api/v1/cluster``'s."""
    node: object
    nodes: list[dict[str, Any]] | None
    queues: int | None
    wal: WalFigures | None
    errors: list[str]


def metrics_figures(text: str) -> MetricsFigures:
    """The queue count and the WAL's sync times from a ``/metrics`` answer."""
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[(sample.name, sample.labels.get("quantile", ""))] = sample.value
    queues = values.get(("quorra_queues", ""))
    syncs = values.get(("quorra_wal_sync_seconds_count", ""))
    wal: WalFigures | None = None
    if syncs is not None:
        total_s = values.get(("quorra_wal_sync_seconds_sum", ""), 0.0)
        recent = {
            q: values.get(("quorra_wal_sync_recent_seconds", q)) for q in ("0.5", "0.99", "1")
        }
        wal = {
            "syncs": int(syncs),
            "sync_mean_ms": round(total_s / syncs * 1000, 3) if syncs else None,
            "recent_syncs": int(values.get(("quorra_wal_sync_recent_syncs", ""), 0)),
            "recent_p50_ms": _ms(recent["0.5"]),
            "recent_p99_ms": _ms(recent["0.99"]),
            "recent_max_ms": _ms(recent["1"]),
        }
    return {"queues": None if queues is None else int(queues), "wal": wal}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def _authorized_status(client: httpx.Client, status: ServerStatus) -> None:
    """Add what needs a token; a part the token may not read is an error, not a crash."""
    import httpx

    try:
        cluster = send(client, "GET", "/api/v1/cluster").json()
        status["node"], status["nodes"] = cluster.get("node"), cluster.get("nodes")
    except (ClientError, httpx.HTTPError) as e:
        status["errors"].append(f"/api/v1/cluster: {e}")
    try:
        figures = metrics_figures(send(client, "GET", "/metrics").text)
        status["queues"], status["wal"] = figures["queues"], figures["wal"]
    except (ClientError, httpx.HTTPError, ValueError) as e:  # ValueError: not Prometheus text
        status["errors"].append(f"/metrics: {e}")


def read_status(url: str, token: str) -> ServerStatus:
    import httpx

    status: ServerStatus = {
        "url": url,
        "healthy": False,
        "readiness": None,
        "node": None,
        "nodes": None,
        "queues": None,
        "wal": None,
        "errors": [],
    }
    try:
        with httpx.Client(base_url=url, timeout=STATUS_TIMEOUT_S) as client:
            status["healthy"] = client.get("/healthz").status_code == 200
            status["readiness"] = client.get("/readyz").json()
    except (httpx.HTTPError, ValueError) as e:
        status["errors"].append(f"{url}: {type(e).__name__}: {e}")
        return status
    if token:
        with api_client(url, token) as client:
            client.timeout = httpx.Timeout(STATUS_TIMEOUT_S)
            _authorized_status(client, status)
    return status


def status_ok(status: ServerStatus) -> bool:
    ready = bool((status["readiness"] or {}).get("ready"))
    return bool(status["healthy"]) and ready and not status["errors"]


def status_facts(status: ServerStatus, token_given: bool) -> Table:
    readiness = status["readiness"] or {}
    health = "up" if status["healthy"] else "down"
    ready = "ready" if readiness.get("ready") else "not ready"
    detail = f"engine {readiness.get('engine')}, migrations {readiness.get('migrations')}"
    rows = [("Server", f"{status['url']}: {health}, {ready} ({detail})")]
    if not token_given:
        rows.append(("", "pass --token (or QUORRA_TOKEN) for nodes, queues and WAL"))
    if status["node"] is not None:
        rows.append(("Node", str(status["node"])))
    for node in status["nodes"] or []:
        leads = len(node.get("leads", []))
        rows.append(("Nodes", f"{node.get('name')} {node.get('health')}, leads {leads}"))
    if status["queues"] is not None:
        rows.append(("Queues", human_count(status["queues"])))
    if (wal := status["wal"]) is not None:
        rows.append(("WAL sync", _wal_text(wal)))
    return _facts(rows)


def _wal_text(wal: WalFigures) -> str:
    since = f"{human_count(wal['syncs'])} since start"
    if wal["sync_mean_ms"] is not None:
        since += f", mean {wal['sync_mean_ms']:.2f} ms"
    if not wal["recent_syncs"] or wal["recent_p50_ms"] is None:
        return f"no recent figures; {since}"
    return (
        f"p50 {wal['recent_p50_ms']:.2f} ms · p99 {wal['recent_p99_ms']:.2f} ms · "
        f"max {wal['recent_max_ms']:.2f} ms over the last {human_count(wal['recent_syncs'])}"
        f" syncs; {since}"
    )


# --- commands ------------------------------------------------------------------------

queue_app = typer.Typer(help="Queues on a server, over the REST API.", no_args_is_help=True)


@queue_app.command("list")
def queue_list(url: Url = DEFAULT_URL, token: Token = "", as_json: Json = False) -> None:
    """The queues the token may see: depth, rates, memory and leader."""
    _request_and_print(url, token, as_json, "GET", "/api/v1/queues", queue_table)


@queue_app.command("show")
def queue_show(
    name: QueueName, url: Url = DEFAULT_URL, token: Token = "", as_json: Json = False
) -> None:
    """A queue's definition and stats."""
    _request_and_print(url, token, as_json, "GET", _queue_path(name), queue_facts)


@queue_app.command("create")
def queue_create(
    name: QueueName,
    url: Url = DEFAULT_URL,
    token: Token = "",
    as_json: Json = False,
    replicas: Annotated[int | None, typer.Option(min=1, help="Raft members.")] = None,
    max_length: Annotated[int | None, typer.Option(min=0, help="Ready messages at most.")] = None,
    max_bytes: Annotated[int | None, typer.Option(min=0, help="Ready bytes at most.")] = None,
    overflow: Annotated[Overflow | None, typer.Option(help="When full.")] = None,
    delivery_limit: Annotated[
        int | None, typer.Option(min=0, help="Deliveries before dead-lettering (0: unlimited).")
    ] = None,
    dead_letter_queue: Annotated[str | None, typer.Option(help="Dead-letter target.")] = None,
    message_ttl_ms: Annotated[int | None, typer.Option(min=0, help="Queue-level TTL.")] = None,
    priorities: Annotated[int | None, typer.Option(min=1, help="Priority levels.")] = None,
    lease_ms: Annotated[int | None, typer.Option(min=1, help="Default lease.")] = None,
    max_message_bytes: Annotated[int | None, typer.Option(min=1, help="Largest body.")] = None,
) -> None:
    """Create a queue (again with the same arguments: no change); unset options: defaults."""
    body = create_body(
        replicas=replicas,
        max_length=max_length,
        max_bytes=max_bytes,
        overflow=overflow,
        delivery_limit=delivery_limit,
        dead_letter_queue=dead_letter_queue,
        message_ttl_ms=message_ttl_ms,
        priorities=priorities,
        lease_ms=lease_ms,
        max_message_bytes=max_message_bytes,
    )

    def work(client: httpx.Client) -> None:
        response = send(client, "PUT", _queue_path(name), body)
        if as_json:
            _print_json(response.json())
        elif response.status_code == 201:
            _say(f"created queue {name!r}")
        else:
            _say(f"queue {name!r} exists with these arguments")

    _with_client(url, token, work)


@queue_app.command("delete")
def queue_delete(
    name: QueueName,
    url: Url = DEFAULT_URL,
    token: Token = "",
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask.")] = False,
) -> None:
    """Delete a queue with all its messages (asks first unless --yes)."""
    if not yes:
        if not stdin_is_terminal():
            stderr().print("[red]error:[/red] no terminal to ask on: pass --yes to delete")
            raise typer.Exit(2)
        typer.confirm(f"Delete queue {name!r} and all its messages?", abort=True, err=True)

    def work(client: httpx.Client) -> None:
        send(client, "DELETE", _queue_path(name))
        _say(f"deleted queue {name!r}")

    _with_client(url, token, work)


@queue_app.command("purge")
def queue_purge(
    name: QueueName, url: Url = DEFAULT_URL, token: Token = "", as_json: Json = False
) -> None:
    """Drop all ready messages of a queue (leased ones stay)."""

    def human(result: dict[str, Any]) -> str:
        return f"purged {result['purged']:,} messages from {name!r}"

    _request_and_print(url, token, as_json, "POST", _queue_path(name, "/purge"), human)


@queue_app.command("snapshot")
def queue_snapshot(
    name: QueueName, url: Url = DEFAULT_URL, token: Token = "", as_json: Json = False
) -> None:
    """Take a checkpoint of a queue now."""

    def human(record: dict[str, Any]) -> str:
        return (
            f"checkpoint of {name!r} at index {record['index']} (term {record['term']}): "
            f"{human_bytes(record['bytes'])}, {record['live_entries']:,} live entries, "
            f"{record['duration_ms']:.1f} ms"
        )

    _request_and_print(url, token, as_json, "POST", _queue_path(name, "/snapshots"), human)


@queue_app.command("compact")
def queue_compact(
    name: QueueName,
    url: Url = DEFAULT_URL,
    token: Token = "",
    as_json: Json = False,
    phase: Annotated[Phase, typer.Option(help="Compaction phase (auto: as needed).")] = Phase.auto,
) -> None:
    """Compact a queue's log now."""
    body: dict[str, object] = {"phase": phase.value if phase is Phase.auto else int(phase.value)}

    def human(record: dict[str, Any]) -> str:
        return (
            f"compacted {name!r} (phase {record['phase']}): segments "
            f"{record['segments_before']} → {record['segments_after']}, "
            f"{human_bytes(record['bytes_before'])} → {human_bytes(record['bytes_after'])}, "
            f"dead entries {record['dead_entries_before']:,} → "
            f"{record['dead_entries_after']:,}, {record['duration_ms']:.1f} ms"
        )

    _request_and_print(url, token, as_json, "POST", _queue_path(name, "/compactions"), human, body)


def status(url: Url = DEFAULT_URL, token: Token = "", as_json: Json = False) -> None:
    """Node health and readiness; with a token also nodes, queue count, WAL sync times."""
    result = read_status(url, token)
    if as_json:
        _print_json(result)
    else:
        _stdout().print(status_facts(result, bool(token)))
    for error in result["errors"]:
        stderr().print(f"[red]error:[/red] {error}", highlight=False, soft_wrap=True)
    if not status_ok(result):
        raise typer.Exit(1)


def register(cli: typer.Typer) -> None:
    cli.add_typer(queue_app, name="queue")
    cli.command("status")(status)
