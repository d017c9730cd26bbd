"""kill -9 of a real process running a Node under load; a new Node on its files must
hold every confirmed message that was not acknowledged, and none that was."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.runtime import Node
from tests.engine.runtime.util import FAST, run

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("mode", ["load", "lone"])
def test_kill_9_under_load_loses_nothing_confirmed(tmp_path: Path, mode: str) -> None:
    """``lone``: one publish at a time and nothing else, each synced by the loop."""
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.engine.runtime.crash_child", str(tmp_path), mode],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 30
    try:
        assert child.stdout.readline().strip() == "READY"
        done = "P " if mode == "lone" else "A "
        while sum(1 for x in lines if x.startswith(done)) < 300:
            line = child.stdout.readline()
            assert line, "the child died by itself"
            lines.append(line.strip())
            assert time.monotonic() < deadline, "too slow"
    finally:
        os.kill(child.pid, signal.SIGKILL)
        # Not communicate(timeout=...): it reads the pipe around the text buffer.
        rest = child.stdout.read()
        child.stdout.close()
        child.wait(timeout=10)
    # The kill may cut the last line short: only whole lines count.
    lines += [x.strip() for x in rest.split("\n")[:-1] if x.strip()]
    published = {x[2:] for x in lines if x.startswith("P ")}
    received = {x[2:] for x in lines if x.startswith("R ")}
    acked = {x[2:] for x in lines if x.startswith("A ")}
    assert len(published) >= 300
    assert acked <= received

    async def recover() -> list[str]:
        node = Node(tmp_path, limits=FAST)
        await node.start()
        try:
            out: list[str] = []
            while True:
                got = await node.receive(
                    "crash", consumer="check", max_messages=1000, wait_ms=1000, lease_ms=None
                )
                if not got:
                    return out
                out += [m.body.decode() for m in got]
                await node.ack("crash", [m.receipt for m in got])
        finally:
            await node.stop()

    remaining = run(recover())
    assert not acked & set(remaining), "an acknowledged message came back"
    # A message received before the kill may have been acked without the child
    # hearing back; one never handed out must still be there.
    lost = published - received - set(remaining)
    assert not lost, f"confirmed messages were lost: {sorted(lost)[:20]} of {len(lost)}"
    assert len(remaining) == len(set(remaining))
