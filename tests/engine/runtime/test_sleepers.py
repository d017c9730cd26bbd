"""Sleeping queues' records across a clean stop (engine/runtime/sleepers.py): idle queues
come back asleep without replaying or electing, answer as before, and a crash at any
later instant or a record that no longer matches its log loses nothing."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

import engine.storage.page_files as page_files_module
from engine.errors import EntryDamaged
from engine.queue.snapshots import page_handles, read_snapshot
from engine.runtime import Node
from engine.runtime.meta import read_meta
from engine.runtime.sleepers import (
    SLEEPERS_PATH,
    decode_sleepers,
    encode_sleepers,
    take_sleepers,
)
from engine.storage import OsDisk
from engine.storage.page_files import PageFiles
from tests.engine.runtime.test_hibernation import BODIES, filled
from tests.engine.runtime.test_paging_node import PAGED, fill
from tests.engine.runtime.util import FAST, drain, msgs, run, started

# Idle queues do not fall asleep on their own here: the stop puts them to sleep.
AWAKE = dataclasses.replace(FAST, queue_sleep_idle_ms=600_000)


def asleep(node: Node) -> list[str]:
    return sorted(n for n, rep in node.context.replicas.items() if rep.dormant is not None)


def restored(node: Node) -> int:
    return node.context.hibernation.restored


async def stopped_with_records(data_dir: Path) -> None:
    """Queues "a" and "b" with BODIES; "leased" with a lease out (not idle at the stop)."""
    node = await started(data_dir, AWAKE)
    await filled(node, ["a", "b", "leased"])
    await node.receive("leased", consumer="c", max_messages=1, wait_ms=0, lease_ms=60_000)
    await node.stop()
    assert (data_dir / SLEEPERS_PATH).exists()


def test_idle_queues_come_back_asleep_after_a_clean_stop(tmp_path: Path) -> None:
    async def body() -> None:
        await stopped_with_records(tmp_path)
        node = await started(tmp_path, AWAKE)
        try:
            assert not (tmp_path / SLEEPERS_PATH).exists(), "read once, removed at start"
            assert restored(node) == 2 and asleep(node) == ["a", "b"]
            assert node.stats("a")["messages_ready"] == 3
            assert node.context.hibernation.woken == 0, "stats do not wake it"
            assert await drain(node, "a") == BODIES
            await node.publish("b", msgs(b"after"))
            assert await drain(node, "b") == [*BODIES, b"after"]
            assert len(await drain(node, "leased")) == 2  # its lease is still out
        finally:
            await node.stop()

    run(body())


@pytest.mark.parametrize("woken", [True, False])
def test_a_crash_after_coming_back_asleep_loses_nothing(tmp_path: Path, woken: bool) -> None:
    async def body() -> None:
        await stopped_with_records(tmp_path)
        node = await started(tmp_path, AWAKE)
        assert restored(node) == 2
        if woken:
            await node.publish("a", msgs(b"after"))
        await node.halt()
        node = await started(tmp_path, AWAKE)
        try:
            assert restored(node) == 0, "the crash left no records"
            assert await drain(node, "a") == [*BODIES, *([b"after"] if woken else [])]
            assert await drain(node, "b") == BODIES
        finally:
            await node.stop()

    run(body())


@pytest.mark.parametrize("crash", [True, False])
def test_records_that_no_longer_match_their_logs_are_not_used(tmp_path: Path, crash: bool) -> None:
    """A records file of an earlier stop put back by hand, after the queues changed (and
    a crash or a clean stop): the changed queue recovers from its log."""

    async def body() -> None:
        await stopped_with_records(tmp_path)
        old = tmp_path.parent / "old-sleepers"
        shutil.copy(tmp_path / SLEEPERS_PATH, old)
        node = await started(tmp_path, AWAKE)
        await node.publish("a", msgs(b"after"))
        await (node.halt() if crash else node.stop())
        shutil.copy(old, tmp_path / SLEEPERS_PATH)
        node = await started(tmp_path, AWAKE)
        try:
            assert asleep(node) == ["b"], "a's log moved on: recovered from it"
            assert await drain(node, "a") == [*BODIES, b"after"]
            assert await drain(node, "b") == BODIES
        finally:
            await node.stop()

    run(body())


def test_a_damaged_records_file_is_dropped_and_removed(tmp_path: Path) -> None:
    async def body() -> None:
        await stopped_with_records(tmp_path)
        path = tmp_path / SLEEPERS_PATH
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
        node = await started(tmp_path, AWAKE)
        try:
            assert restored(node) == 0 and not path.exists()
            assert await drain(node, "a") == BODIES
        finally:
            await node.stop()

    run(body())


def test_records_round_trip_and_stop_at_their_byte_limit(tmp_path: Path) -> None:
    async def body() -> None:
        await stopped_with_records(tmp_path)

    run(body())
    disk = OsDisk(str(tmp_path))
    data = disk.read(SLEEPERS_PATH)
    sleepers = decode_sleepers(data)
    assert len(sleepers) == 2
    again = list(sleepers.values())
    assert encode_sleepers(again, 1 << 30) == data
    first = encode_sleepers(again, len(data) - 1)
    assert list(decode_sleepers(first)) == [again[0].uid]
    assert take_sleepers(disk) == sleepers and not disk.exists(SLEEPERS_PATH)
    assert take_sleepers(disk) == {}
    with pytest.raises(ValueError):
        decode_sleepers(data[:-1])


def _flip_body_of_queue(data_dir: Path, name: str, body: bytes) -> None:
    """Flip a bit of ``body`` where queue ``name``'s segments hold it."""
    disk = OsDisk(str(data_dir))
    for queue_dir in (data_dir / "queues").iterdir():
        meta = read_meta(disk, queue_dir.name)
        if meta is None or meta.name != name:
            continue
        for seg in (queue_dir / "segments").iterdir():
            raw = bytearray(seg.read_bytes())
            at = raw.find(body)
            if at >= 0:
                raw[at] ^= 0x01
                seg.write_bytes(bytes(raw))
                return
    raise AssertionError(f"no segment of {name} holds {body!r}")


def test_a_queue_back_asleep_finds_a_damaged_body_when_it_reads_it(tmp_path: Path) -> None:
    """A queue that comes back asleep is not replayed, and its log is not read at start
    (its record stands for it, as a checkpoint would): a body damaged on disk since the
    stop is found by the delivery that reads it, never delivered altered, and the other
    queues serve as before."""

    async def body() -> None:
        await stopped_with_records(tmp_path)
        _flip_body_of_queue(tmp_path, "a", b"three")
        node = await started(tmp_path, AWAKE)
        try:
            assert restored(node) == 2 and asleep(node) == ["a", "b"]
            assert await drain(node, "b") == BODIES
            with pytest.raises(EntryDamaged):
                await drain(node, "a")
        finally:
            await node.stop()

    run(body())


def test_a_queue_back_asleep_keeps_its_page_files_without_listing_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A queue that spilled pages, checkpointed (the checkpoint pins them) and was
    consumed down to a few messages sleeps at the stop. Its record carries its page
    files' bookkeeping, the same as listing its page directory gives; the start uses it
    without listing, and pages it spills after its wake are new files: those the
    checkpoint names stay as they were."""
    paged = dataclasses.replace(PAGED, queue_sleep_idle_ms=600_000)

    async def consume(node: Node, count: int) -> list[bytes]:
        bodies: list[bytes] = []
        while len(bodies) < count:
            left = count - len(bodies)
            got = await node.receive(
                "deep", consumer="c", max_messages=min(500, left), wait_ms=0, lease_ms=None
            )
            bodies += [m.body for m in got]
            await node.ack("deep", [m.receipt for m in got])
        return bodies

    async def body() -> None:
        node = await started(tmp_path, paged)
        await fill(node, "deep", 3000)
        await node.checkpoint("deep")
        assert await consume(node, 2900) == [f"deep{k}".encode() for k in range(2900)]
        uid = node.context.replicas["deep"].uid
        await node.stop()
        disk = OsDisk(str(tmp_path))
        pages_dir = tmp_path / "queues" / uid / "pages"
        kept = {p.name: p.read_bytes() for p in pages_dir.iterdir() if p.suffix == ".page"}
        assert len(kept) > 10, "the checkpoint pins the pages spilled"
        # The machine asleep holds none of them (a queue sleeps with no page out): the
        # bookkeeping says they are dropped, kept only for the checkpoint.
        sleeper = decode_sleepers(disk.read(SLEEPERS_PATH))[uid]
        held = page_handles(read_snapshot(sleeper.dormant.record.snapshot))
        assert held == []
        assert sleeper.pages == PageFiles(disk, uid, held).pack()

        def not_listed(*args: object) -> None:
            raise AssertionError("page files listed at start")

        monkeypatch.setattr(page_files_module.PageFiles, "__init__", not_listed)
        node = await started(tmp_path, paged)
        try:
            assert restored(node) == 1 and asleep(node) == ["deep"]
            monkeypatch.undo()
            tail = [f"deep{k}".encode() for k in range(2900, 3000)]
            assert await consume(node, 100) == tail
            await fill_again(node)
            assert await consume(node, 3000) == [f"again{k}".encode() for k in range(3000)]
            for name, data in kept.items():
                assert (pages_dir / name).read_bytes() == data, name
        finally:
            await node.stop()

    run(body())


async def fill_again(node: Node) -> None:
    """3,000 more messages into "deep" (it spills pages again)."""
    for start in range(0, 3000, 500):
        await node.publish("deep", msgs(*(f"again{k}".encode() for k in range(start, start + 500))))
