"""A real process writes through the WAL with real files and fdatasync and is killed with
SIGKILL mid-write; recovery must keep every entry it reported durable, intact."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from engine.storage import NodeStorage, OsDisk
from tests.engine.storage.conftest import small_limits

ROOT = Path(__file__).resolve().parents[3]

CHILD = textwrap.dedent(
    """
    import sys
    from engine.raft.entry import Entry, EntryKind
    from engine.storage import NodeStorage, OsDisk, Persisted
    from tests.engine.storage.test_kill9 import LIMITS, payload

    storage = NodeStorage.open(OsDisk(sys.argv[1]), LIMITS)
    for uid in ("a", "b"):
        storage.open_server(uid)
    i = 0
    while True:
        i += 1
        for uid in ("a", "b"):
            storage.append(uid, [Entry(i, 1, EntryKind.COMMAND, i, payload(uid, i))])
        for event in storage.sync():
            if isinstance(event, Persisted) and event.uid == "b":
                print(event.index, flush=True)
    """
)


LIMITS = small_limits(
    wal_file_bytes_max=48 * 1024, wal_batch_bytes_max=16 * 1024, entry_bytes_max=4096
)


def payload(uid: str, i: int) -> bytes:
    return (f"{uid}-{i}-".encode() * 200)[: 700 + i % 300]


def test_kill_minus_9_mid_write_loses_nothing_reported_durable(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path)],
        stdout=subprocess.PIPE,
        env=env,
        cwd=ROOT,
    )
    assert child.stdout is not None
    acked = 0
    try:
        for line in child.stdout:
            acked = int(line)
            if acked >= 150:
                break
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
    assert acked >= 150, "the writer died before it made progress"
    assert len(os.listdir(tmp_path / "queues" / "a" / "segments")) > 0  # rolls happened

    storage = NodeStorage.open(OsDisk(str(tmp_path)), LIMITS)
    for uid in ("a", "b"):
        log = storage.open_server(uid).log
        assert log.last_index() >= acked
        got = log.entries(1, log.last_index() + 1, 1 << 30)
        assert [e.index for e in got] == list(range(1, log.last_index() + 1))
        assert all(e.data == payload(uid, e.index) for e in got)
    storage.close()
