"""A real process compacts real files, round after round, and is killed with SIGKILL at
a random moment; recovery keeps every live entry of its snapshot and leaves no file the
log does not use."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from pyroaring import BitMap64

from engine.storage import NodeStorage, OsDisk
from tests.engine.storage.compaction.conftest import UID, assert_intact, limits

ROOT = Path(__file__).resolve().parents[4]
N = 6000
LIMITS = limits(
    wal_file_bytes_max=8 << 20,
    wal_batch_bytes_max=1 << 20,
    segment_entries_max=64,
    segment_file_bytes_max=64 << 10,
)

CHILD = textwrap.dedent(
    """
    import sys
    from engine.raft.entry import Entry, EntryKind
    from engine.storage import NodeStorage, OsDisk
    from tests.engine.storage.compaction.conftest import UID, checkpoint
    from tests.engine.storage.compaction.test_kill9 import LIMITS, N, body, live_of

    storage = NodeStorage.open(OsDisk(sys.argv[1]), LIMITS)
    storage.open_server(UID)
    for lo in range(1, N + 1, 100):
        storage.append(UID, [Entry(i, 1, EntryKind.COMMAND, i, body(i)) for i in range(lo, lo + 100)])
    storage.sync()
    storage.close()
    storage = NodeStorage.open(OsDisk(sys.argv[1]), LIMITS)
    storage.open_server(UID)
    for r in range(1, 40):
        storage.append(UID, [Entry(N + r, 1, EntryKind.COMMAND, N + r, body(N + r))])
        storage.sync()
        checkpoint(storage, N + r, live_of(r))
        print(r, flush=True)
        storage.compact(UID, "auto")
    print("done", flush=True)
    """
)


def body(i: int) -> bytes:
    return (f"{i}:".encode() * 100)[: 300 + i % 200]


def live_of(r: int) -> BitMap64:
    """Round ``r``'s live set: a random-looking subset of ``1..N``, shrinking each round."""
    keep = 1000 // (r + 1)
    return BitMap64(i for i in range(1, N + 1) if (i * 2654435761) % 1000 < keep)


def test_kill_minus_9_mid_compaction_loses_nothing(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path)], stdout=subprocess.PIPE, env=env, cwd=ROOT
    )
    assert child.stdout is not None
    rounds = 0
    try:
        for line in child.stdout:
            if line.strip() == b"done":
                break
            rounds = int(line)
            if rounds >= 2:  # round 2's compaction takes about a second: kill inside it
                time.sleep(random.Random().uniform(0.02, 0.8))
                break
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
    assert rounds >= 2, "the child died before it compacted"

    storage = NodeStorage.open(OsDisk(str(tmp_path)), LIMITS)
    rec = storage.open_server(UID)
    assert rec.checkpoint is not None
    snap = storage.log(UID).snapshot_index()
    if snap:  # the snapshot of round r keeps exactly that round's live entries
        assert storage.log(UID).snapshot_live == live_of(snap - N)
        expected = {i: body(i) for i in range(1, storage.log(UID).last_index() + 1)}
        assert_intact(storage, storage.log(UID).snapshot_live, snap, expected)
    leftovers = [
        n for n in os.listdir(tmp_path / "queues" / UID / "segments") if not n.endswith(".seg")
    ]
    assert leftovers == []
    storage.close()
