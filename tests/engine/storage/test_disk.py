from __future__ import annotations

import errno
import random
from pathlib import Path

import pytest

from engine.storage.disk import Disk, FakeDisk, OsDisk, write_file_atomic


def _roundtrip(disk: Disk) -> None:
    disk.makedirs("a/b")
    f = disk.open("a/b/x", create=True)
    f.append(b"hello ")
    f.append(b"world")
    f.pwrite(0, b"H")
    f.sync()
    assert f.size() == 11 and f.pread(6, 5) == b"world"
    into = bytearray(b"-" * 8)
    assert f.pread_into(3, memoryview(into)[:4]) == 4 and into == b"lo w----"
    assert f.pread_into(9, memoryview(into)) == 2 and into == b"ld w----"  # the end
    assert f.pread_into(11, memoryview(into)) == 0
    f.truncate(5)
    f.close()
    assert disk.read("a/b/x") == b"Hello"
    write_file_atomic(disk, "a/b/y", b"data")
    write_file_atomic(disk, "a/b/w", b"he", [b"ll", b"", b"o w", b"orld"])
    assert disk.read("a/b/w") == b"hello world"
    disk.remove("a/b/w")
    assert disk.listdir("a/b") == ["x", "y"] and disk.listdir("a") == ["b"]
    disk.rename("a/b/y", "a/b/z")
    disk.remove("a/b/x")
    assert disk.listdir("a/b") == ["z"] and disk.exists("a/b/z") and not disk.exists("a/b/x")
    assert disk.listdir("nope") == []
    # Whole files of any length are read, empty ones too; a missing one is no file.
    big = bytes(range(256)) * 700  # more than one of the reads OsDisk.read makes
    write_file_atomic(disk, "a/big", big)
    write_file_atomic(disk, "a/empty", b"")
    assert disk.read("a/big") == big and disk.read("a/empty") == b""
    with pytest.raises(FileNotFoundError):
        disk.read("a/missing")


def test_os_disk_does_what_the_protocol_says(tmp_path: Path) -> None:
    _roundtrip(OsDisk(str(tmp_path)))


def test_fake_disk_does_what_the_protocol_says() -> None:
    _roundtrip(FakeDisk())


@pytest.mark.parametrize("kind", ["os", "fake"])
def test_append_parts_writes_the_parts_in_order_after_what_is_there(
    kind: str, tmp_path: Path
) -> None:
    disk: Disk = OsDisk(str(tmp_path)) if kind == "os" else FakeDisk()
    rng = random.Random(7)
    # More buffers than one pwritev takes, of sizes from empty to large.
    parts = [rng.randbytes(rng.choice([0, 1, 5, 300, 70_000])) for _ in range(2500)]
    f = disk.open("x", create=True)
    f.append(b"head")
    f.append_parts(parts)
    f.append_parts([])
    f.append(b"end")
    f.sync()
    expected = b"head" + b"".join(parts) + b"end"
    assert f.size() == len(expected)
    f.close()
    assert disk.read("x") == expected


def test_crash_loses_unsynced_data_and_directory_entries() -> None:
    disk = FakeDisk()
    disk.makedirs("d")
    f = disk.open("d/kept", create=True)
    f.append(b"synced")
    f.sync()
    disk.sync_dir("d")
    f.append(b" lost")
    g = disk.open("d/unlisted", create=True)
    g.append(b"x")
    g.sync()  # data synced, but the directory entry is not
    disk.crash()
    assert disk.listdir("d") == ["kept"] and disk.read("d/kept") == b"synced"


def test_crash_may_tear_the_last_append() -> None:
    disk = FakeDisk()
    disk.makedirs("d")
    f = disk.open("d/f", create=True)
    f.append(b"A" * 10)
    f.sync()
    disk.sync_dir("d")
    f.append(b"B" * 100)
    seen = set()
    for seed in range(20):
        copy = FakeDisk()
        copy.makedirs("d")
        h = copy.open("d/f", create=True)
        h.append(b"A" * 10)
        h.sync()
        copy.sync_dir("d")
        h.append(b"B" * 100)
        copy.crash(random.Random(seed))
        data = copy.read("d/f")
        assert data.startswith(b"A" * 10) and set(data[10:]) <= {ord("B")}
        seen.add(len(data))
    assert len(seen) > 5


def test_faults_refuse_writes_and_write_nothing() -> None:
    disk = FakeDisk()
    disk.makedirs("d")
    f = disk.open("d/f", create=True)
    f.append(b"12345")
    disk.space_bytes = 8
    with pytest.raises(OSError) as info:
        f.append(b"6789")
    assert info.value.errno == errno.ENOSPC and disk.read("d/f") == b"12345"
    disk.space_bytes = None
    disk.fail_errno = errno.EIO
    with pytest.raises(OSError):
        f.sync()
    disk.fail_errno = None
    disk.flip_bit("d/f", 0)
    assert disk.read("d/f") == b"02345"
