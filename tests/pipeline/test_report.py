"""``quorra pipeline report`` on a known history gives the known figures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from pipeline.cli import main
from pipeline.report import analyse, write_report

T0 = 1_700_000_000_000


def stats(published: int, delivered: int, acked: int, dead: int, unacked: int, live: int, dl: int):
    return {
        "published": published,
        "delivered": delivered,
        "acked": acked,
        "dead_lettered": dead,
        "messages_unacked": unacked,
        "messages_ready": published - acked - dead - unacked,
        "publish_rate": 0.0,
        "deliver_rate": 0.0,
        "ack_rate": 0.0,
        "log": {"live_entries": live, "dead_entries": dl},
    }


def known_history() -> dict[str, Any]:
    """Two 10 s windows: 1000 then 500 published; 20 redeliveries; 10 dead-lettered."""
    return {
        "queue": "orders",
        "samples": [
            {"at_ms": T0, "stats": stats(0, 0, 0, 0, 0, 0, 0)},
            {"at_ms": T0 + 10_000, "stats": stats(1000, 800, 700, 0, 100, 300, 600)},
            {"at_ms": T0 + 20_000, "stats": stats(1500, 1200, 1150, 10, 20, 340, 100)},
        ],
        "snapshots": [
            {"index": 100, "taken_at": "2023-11-14T22:13:20Z", "bytes": 10, "live_entries": 5},
            {"index": 1100, "taken_at": "2023-11-14T22:13:40Z", "bytes": 10, "live_entries": 5},
        ],
        "compactions": [
            {
                "phase": "1",
                "trigger": "auto",
                "started_at": "2023-11-14T22:13:30Z",
                "duration_ms": 5.0,
                "segments_before": 8,
                "segments_after": 4,
                "bytes_before": 8_000_000,
                "bytes_after": 4_000_000,
                "live_entries": 300,
                "dead_entries_before": 600,
                "dead_entries_after": 150,
            },
            {
                "phase": "1,2,3",
                "trigger": "manual",
                "started_at": "2023-11-14T22:13:35Z",
                "duration_ms": 9.0,
                "segments_before": 4,
                "segments_after": 2,
                "bytes_before": 4_000_000,
                "bytes_after": 3_000_000,
                "live_entries": 340,
                "dead_entries_before": 170,
                "dead_entries_after": 0,
            },
        ],
        "messages": [
            {"id": 1, "published_at": T0 + 15_000, "delivery_count": 0},
            {"id": 2, "published_at": T0 + 18_000, "delivery_count": 1},
        ],
        "consumed": [
            {
                "id": 10 + k,
                "published_at": T0,
                "settled_at": T0 + 100 * (k + 1),
                "delivery_count": 2 if k < 2 else 1,
            }
            for k in range(10)
        ],
    }


def test_known_history_gives_known_figures() -> None:
    result = analyse(known_history(), now_ms=T0 + 30_000)
    assert result["summary"] == {
        "queue": "orders",
        "generated_at_ms": T0 + 30_000,
        "throughput": {
            "windows": 2,
            "mean_published_per_s": 75.0,
            "peak_published_per_s": 100.0,
            "mean_delivered_per_s": 60.0,
            "peak_delivered_per_s": 80.0,
            "mean_acked_per_s": 57.5,
            "peak_acked_per_s": 70.0,
            "mean_log_entries_per_s": 50.0,
        },
        "time_queued_ms": {
            "consumed": {"count": 10, "p50": 550.0, "p95": 955.0, "max": 1000.0},
            "ready": {"count": 2, "p50": 3500.0, "p95": 4850.0, "max": 5000.0},
        },
        "redelivery_rate": 0.2,
        "dead_letter_rate": round(10 / 1500, 6),
        "compaction": {
            "runs": 2,
            "bytes_reclaimed_total": 5_000_000,
            "bytes_reclaimed_per_run_mean": 2_500_000.0,
            "reclaimed_fraction": round(5 / 12, 6),
            "live_dead_ratio_after_last_run": None,
            "live_dead_ratio_now": 3.4,
        },
    }
    throughput = result["throughput"]
    assert throughput["published_per_s"].tolist()[:2] == [100.0, 50.0]
    assert throughput["source"].tolist() == ["stats", "stats", "checkpoints"]
    assert result["compactions"]["bytes_reclaimed"].tolist() == [4_000_000, 1_000_000]
    assert result["compactions"]["live_dead_ratio_before"].tolist() == [0.5, 2.0]
    assert result["live_dead"]["live_dead_ratio"].tolist()[1:] == [0.5, 3.4]


def test_redelivery_rate_from_counters_without_consumed_messages() -> None:
    history = known_history() | {"consumed": []}
    summary = analyse(history, now_ms=T0 + 30_000)["summary"]
    # 1200 deliveries; 1150 acked + 10 dead-lettered + 20 leased were final.
    assert summary["redelivery_rate"] == round(20 / 1200, 6)
    assert summary["time_queued_ms"]["consumed"]["count"] == 0


def test_report_cli_writes_parquet_and_summaries(tmp_path: Path) -> None:
    export = tmp_path / "history.json"
    export.write_text(json.dumps({"exported_at": T0 + 30_000, "queues": [known_history()]}))
    out = tmp_path / "report"
    assert main(["report", "--export", str(export), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["generated_at_ms"] == T0 + 30_000
    assert summary["queues"]["orders"]["compaction"]["bytes_reclaimed_total"] == 5_000_000
    per_queue = json.loads((out / "orders" / "summary.json").read_text())
    assert per_queue == summary["queues"]["orders"]
    compactions = pd.read_parquet(out / "compactions.parquet")
    assert compactions["bytes_reclaimed"].tolist() == [4_000_000, 1_000_000]
    for table in ("throughput", "time_queued", "live_dead"):
        assert len(pd.read_parquet(out / f"{table}.parquet")) > 0


def test_empty_history_has_no_figures() -> None:
    summary = analyse({"queue": "empty"}, now_ms=T0)["summary"]
    assert summary["throughput"]["windows"] == 0
    assert summary["redelivery_rate"] is None
    assert summary["compaction"]["runs"] == 0


@pytest.mark.integration
def test_report_from_a_live_server(client: Any, queue: str, quorra_server: Any, tmp_path: Path):
    client.publish(queue, [b"m%d" % i for i in range(50)])
    received = client.receive(queue, max_messages=20, lease_ms=30_000)
    client.ack(queue, [m.receipt for m in received])
    out = tmp_path / "live"
    code = main(
        [
            "report",
            "--server",
            quorra_server.url,
            "--token",
            quorra_server.token,
            "--queue",
            queue,
            "--out",
            str(out),
            "--samples",
            "1",
        ]
    )
    assert code == 0
    summary = json.loads((out / queue / "summary.json").read_text())
    assert summary["time_queued_ms"]["ready"]["count"] == 30
    assert summary["redelivery_rate"] == 0.0
    assert summary["dead_letter_rate"] == 0.0
    assert write_report  # the module's writer is what the CLI used
