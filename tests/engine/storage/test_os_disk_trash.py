"""``OsDisk.remove`` takes a file away at once and frees it in the background; a crash
between the two leaves it in the trash, emptied at the next open."""

from __future__ import annotations

import os
import time
from pathlib import Path

from engine.storage.disk import TRASH_DIR, OsDisk


def _eventually_empty(directory: Path, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while os.listdir(directory):
        assert time.monotonic() < deadline, os.listdir(directory)
        time.sleep(0.01)


def test_a_removed_file_is_gone_at_once_and_unlinked_later(tmp_path: Path) -> None:
    disk = OsDisk(str(tmp_path))
    disk.makedirs("wal")
    for name in ("a.wal", "b.wal"):
        f = disk.open(f"wal/{name}", create=True)
        f.append(b"x" * 100_000)
        f.sync()
        f.close()
    disk.remove("wal/a.wal")
    disk.sync_dir("wal")
    assert disk.listdir("wal") == ["b.wal"] and not disk.exists("wal/a.wal")
    _eventually_empty(tmp_path / TRASH_DIR)
    # The same name may be used again at once: the trashed file does not come back.
    f = disk.open("wal/a.wal", create=True)
    f.append(b"new")
    f.close()
    disk.remove("wal/b.wal")
    assert disk.read("wal/a.wal") == b"new"


def test_removing_a_missing_file_is_an_error(tmp_path: Path) -> None:
    disk = OsDisk(str(tmp_path))
    try:
        disk.remove("nothing")
    except FileNotFoundError:
        return
    raise AssertionError("removed a file that was not there")


def test_files_a_crash_left_in_the_trash_are_unlinked_at_open(tmp_path: Path) -> None:
    trash = tmp_path / TRASH_DIR
    trash.mkdir()
    (trash / "0123-00000007.wal").write_bytes(b"y" * 1000)
    OsDisk(str(tmp_path))
    _eventually_empty(trash)
