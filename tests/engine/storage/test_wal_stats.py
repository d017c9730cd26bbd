"""The WAL's sync-time record: histogram buckets, recent percentiles, and that a real
WAL records one time per group commit."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from engine.limits import Limits
from engine.raft.entry import Entry, EntryKind
from engine.storage import OsDisk, Wal
from engine.storage.wal import AppendOp
from engine.storage.wal_stats import RECENT_SYNCS, SYNC_BUCKETS_S, WalTimes

times = st.lists(st.floats(min_value=0.0, max_value=5.0), max_size=RECENT_SYNCS + 50)


@given(times)
def test_buckets_and_recent_figures_agree_with_the_times(seconds: list[float]) -> None:
    t = WalTimes()
    for i, s in enumerate(seconds):
        t.record(s, i)
    got = t.stats(7)
    assert got.file_seq == 7
    assert got.batches == len(seconds)
    assert got.bytes_written == sum(range(len(seconds)))
    assert got.sync_buckets == tuple(
        sum(1 for s in seconds if s <= bound) for bound in SYNC_BUCKETS_S
    )
    recent = seconds[-RECENT_SYNCS:]
    assert got.recent_syncs == len(recent)
    if recent:
        assert got.recent_max_ms == round(max(recent) * 1000, 3)
        ranked = sorted(recent)
        p99 = ranked[max(0, -(-99 * len(ranked) // 100) - 1)]  # nearest rank
        assert got.recent_p99_ms == round(p99 * 1000, 3)
        assert got.recent_p50_ms <= got.recent_p99_ms <= got.recent_max_ms
    else:
        assert got.recent_max_ms == got.recent_p99_ms == 0.0


def test_a_wal_records_one_sync_time_per_batch(tmp_path: Path) -> None:
    wal = Wal(OsDisk(str(tmp_path)), Limits(), 1, {})
    assert wal.stats().batches == 0
    for i in range(1, 4):
        wal.submit(AppendOp("q", (Entry(i, 1, EntryKind.COMMAND, 0, b"x" * 100),)))
        assert wal.write_batch().error is None
    got = wal.stats()
    assert got.batches == 3 and got.file_seq == 1
    assert got.bytes_written > 300
    assert 0 < got.recent_max_ms < 60_000 and got.sync_seconds_sum > 0
    wal.close()
