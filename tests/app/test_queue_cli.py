"""``quorra queue ...``, ``quorra status``, ``publish`` and ``consume`` through
``typer.testing.CliRunner`` against a real server process (``tests/app/conftest.py``),
with the URL and token from ``QUORRA_URL``/``QUORRA_TOKEN`` as an operator sets them."""

from __future__ import annotations

import json
import secrets
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner, Result

from app import queue_cli
from app.cli import cli
from app.client_cli import show_progress
from tests.app.conftest import Server, free_port


def run(server: Server, token: str, *args: str, input: str | None = None) -> Result:
    env = {"QUORRA_URL": server.url, "QUORRA_TOKEN": token}
    return CliRunner().invoke(cli, list(args), env=env, input=input)


def new_name() -> str:
    return f"cli-{secrets.token_hex(4)}"


def as_json(result: Result) -> Any:
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_create_show_list_and_delete_a_queue(server: Server, admin_token: str) -> None:
    name, dead = new_name(), new_name()
    assert "created queue" in run(server, admin_token, "queue", "create", dead).stdout
    options = ["--max-length", "500", "--message-ttl-ms", "60000", "--dead-letter-queue", dead,
               "--priorities", "3", "--lease-ms", "5000", "--delivery-limit", "0",
               "--overflow", "drop-head"]  # fmt: skip
    created = run(server, admin_token, "queue", "create", name, *options)
    assert created.exit_code == 0 and created.stdout.strip() == f"created queue {name!r}"
    again = run(server, admin_token, "queue", "create", name, *options)
    assert again.stdout.strip() == f"queue {name!r} exists with these arguments"

    shown = as_json(run(server, admin_token, "queue", "show", name, "--json"))
    assert {k: shown["arguments"][k] for k in ("max_length", "message_ttl_ms", "priorities")} == {
        "max_length": 500,
        "message_ttl_ms": 60000,
        "priorities": 3,
    }
    assert shown["arguments"]["dead_letter_queue"] == dead
    assert shown["arguments"]["delivery_limit"] is None  # 0: unlimited
    assert shown["arguments"]["overflow"] == "drop-head" and shown["arguments"]["lease_ms"] == 5000
    human = run(server, admin_token, "queue", "show", name).stdout
    assert name in human and "max_length=500" in human and "Raft" in human

    listed = as_json(run(server, admin_token, "queue", "list", "--json"))
    assert {name, dead} <= {q["name"] for q in listed}
    table = run(server, admin_token, "queue", "list").stdout
    header = table.splitlines()[0].split()
    assert header == ["Name", "Ready", "Unacked", "Publish", "Deliver", "Ack", "Memory", "Leader"]
    row = next(line.split() for line in table.splitlines() if line.startswith(name + " "))
    assert row[1:3] == ["0", "0"] and row[-1] == shown["stats"]["raft"]["leader"]

    deleted = run(server, admin_token, "queue", "delete", name, "--yes")
    assert deleted.exit_code == 0 and deleted.stdout.strip() == f"deleted queue {name!r}"
    gone = run(server, admin_token, "queue", "show", name)
    assert gone.exit_code == 1 and gone.stdout == ""
    assert f"Queue not found (HTTP 404): no queue {name!r}" in gone.stderr


def test_a_problem_is_its_title_and_detail_on_stderr(server: Server, admin_token: str) -> None:
    name = new_name()
    run(server, admin_token, "queue", "create", name, "--max-length", "1")
    conflict = run(server, admin_token, "queue", "create", name, "--max-length", "2")
    assert conflict.exit_code == 1 and conflict.stdout == ""
    assert conflict.stderr.startswith("error: Conflicting queue definition (HTTP 409): ")
    assert name in conflict.stderr
    refused = run(server, "not-a-token", "queue", "list")
    assert refused.exit_code == 1 and "(HTTP 401)" in refused.stderr
    missing = run(server, "", "queue", "list")
    assert missing.exit_code == 1 and "no token" in missing.stderr


def test_delete_asks_first(
    server: Server, admin_token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = new_name()
    run(server, admin_token, "queue", "create", name)

    def exists() -> bool:
        return run(server, admin_token, "queue", "show", name).exit_code == 0

    piped = run(server, admin_token, "queue", "delete", name, input="y\n")
    assert piped.exit_code == 2 and "pass --yes" in piped.stderr and exists()
    monkeypatch.setattr(queue_cli, "stdin_is_terminal", lambda: True)
    declined = run(server, admin_token, "queue", "delete", name, input="n\n")
    assert declined.exit_code == 1 and exists()
    assert f"Delete queue {name!r} and all its messages?" in declined.stderr
    confirmed = run(server, admin_token, "queue", "delete", name, input="y\n")
    assert confirmed.exit_code == 0 and not exists()


def test_publish_consume_purge_snapshot_and_compact(server: Server, admin_token: str) -> None:
    name = new_name()
    run(server, admin_token, "queue", "create", name)
    lines = "".join(f"m{i}\n" for i in range(10))
    published = run(server, admin_token, "publish", name, "--batch", "3", input=lines)
    assert published.exit_code == 0 and published.stderr == f"published 10 messages to {name!r}\n"
    consumed = run(server, admin_token, "consume", name, "--max", "4", "--wait-ms", "0")
    assert consumed.stdout == "m0\nm1\nm2\nm3\n"
    assert consumed.stderr == f"consumed 4 messages from {name!r}\n"  # piped: no bar

    assert as_json(run(server, admin_token, "queue", "purge", name, "--json")) == {"purged": 6}
    assert (
        run(server, admin_token, "queue", "purge", name).stdout
        == f"purged 0 messages from {name!r}\n"
    )

    snapshot = as_json(run(server, admin_token, "queue", "snapshot", name, "--json"))
    assert snapshot["trigger"] == "manual" and snapshot["index"] > 0
    said = run(server, admin_token, "queue", "snapshot", name).stdout
    assert said.startswith(f"checkpoint of {name!r} at index ")
    compaction = as_json(run(server, admin_token, "queue", "compact", name, "--json"))
    assert compaction["trigger"] == "manual" and "segments_after" in compaction
    said = run(server, admin_token, "queue", "compact", name, "--phase", "1").stdout
    assert said.startswith(f"compacted {name!r} (phase ") and " → " in said  # the phase it ran
    bad_phase = run(server, admin_token, "queue", "compact", name, "--phase", "4")
    assert bad_phase.exit_code == 2


def test_status(server: Server, admin_token: str, admin: httpx.Client) -> None:
    name = new_name()
    run(server, admin_token, "queue", "create", name)
    admin.post(f"/api/v1/queues/{name}/messages", json={"messages": [{"body": "x"}]})
    status = as_json(run(server, admin_token, "status", "--json"))
    assert status["healthy"] is True and status["readiness"]["ready"] is True
    assert status["errors"] == [] and status["queues"] >= 1
    assert status["nodes"][0]["health"] == "up" and name in status["nodes"][0]["leads"]
    wal = status["wal"]
    assert wal["syncs"] >= wal["recent_syncs"] >= 1
    assert 0 < wal["recent_p50_ms"] <= wal["recent_p99_ms"] <= wal["recent_max_ms"]
    human = run(server, admin_token, "status").stdout
    assert "up, ready" in human and "WAL sync" in human and " p99 " in human

    open_only = run(server, "", "status")
    assert open_only.exit_code == 0 and "pass --token" in open_only.stdout
    nobody = CliRunner().invoke(
        cli, ["status", "--json", "--url", f"http://127.0.0.1:{free_port()}"]
    )
    assert nobody.exit_code == 1 and json.loads(nobody.stdout)["healthy"] is False


@pytest.mark.parametrize(
    ("stderr_tty", "data_tty", "shown"),
    [(True, False, True), (True, True, False), (False, False, False), (False, True, False)],
)
def test_a_progress_bar_only_on_a_terminal_that_carries_no_data(
    stderr_tty: bool, data_tty: bool, shown: bool
) -> None:
    """stderr piped: no bar; the messages (consume) or the typed lines (publish) on the
    same terminal: no bar either, it would garble them."""
    assert show_progress(stderr_tty, data_tty) is shown
