"""``quorra pipeline report``: per-queue analytics from a queue's history.

Input, per queue, is a *history* (the export format, one JSON file
``{"exported_at": ms, "queues": [history, ...]}``)::

    {"queue": "orders",
     "samples": [{"at_ms": ms, "stats": {...GET /queues/{q} "stats"...}}, ...],
     "snapshots": [{...GET /queues/{q}/snapshots item...}, ...],
     "compactions": [{...GET /queues/{q}/compactions "history" item...}, ...],
     "messages": [{"id", "published_at", "delivery_count"}, ...],      # browsed, ready
     "consumed": [{"id", "published_at", "settled_at", "delivery_count"}, ...]}

From a server the report takes ``--samples`` stats samples ``--interval-s`` apart, the
snapshot and compaction history, and browses up to ``--browse-max`` ready messages;
``consumed`` only comes from an export (the REST API keeps no per-message settle times).
The history is small (one row per sample, run or message), so the job runs in pandas.

Figures (all computed by ``analyse``; formulas are part of the contract):

* throughput: per window between consecutive samples, ``published/delivered/acked``
  counter deltas over seconds; with one sample, its ``publish_rate``/``deliver_rate``/
  ``ack_rate``. ``log_entries_per_s`` from checkpoint index deltas over time.
* time queued: ``settled_at - published_at`` of consumed messages, ``at - published_at``
  (age) of ready ones; count, p50, p95 and max in ms.
* redelivery rate: share of deliveries that did not settle their message,
  ``(delivered - acked - dead_lettered - messages_unacked) / delivered``, from the last
  sample; with consumed messages, the share of them with ``delivery_count > 1``.
* dead-letter rate: ``dead_lettered / published`` (last sample).
* compaction efficiency: per run ``bytes_reclaimed = bytes_before - bytes_after``;
  live/dead ratio before and after each run (``live / dead``, None when dead is 0), and
  ``log.live_entries / log.dead_entries`` at each sample.

Output in ``--out DIR`` (see ``pipeline`` for the summary's shape): ``summary.json``,
``<queue>/summary.json``, and Parquet tables ``throughput``, ``time_queued``,
``compactions``, ``live_dead`` (each ``<table>.parquet`` with a ``queue`` column).
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from pipeline.queues import browse, history, queue_info, to_ms
from quorra.client import Client

BROWSE_MAX = 100_000
TABLES = ("throughput", "time_queued", "compactions", "live_dead")


# --- collecting ---------------------------------------------------------------------


def collect(
    client: Client,
    queues: Sequence[str],
    samples: int = 2,
    interval_s: float = 1.0,
    browse_max: int = BROWSE_MAX,
) -> dict[str, Any]:
    """An export of the named queues, fetched through the REST API."""
    histories: dict[str, dict[str, Any]] = {
        q: {"queue": q, "samples": [], "messages": [], "consumed": []} for q in queues
    }
    for k in range(samples):
        if k:
            time.sleep(interval_s)
        for q in queues:
            stats = queue_info(client, q).get("stats", {})
            histories[q]["samples"].append({"at_ms": int(time.time() * 1000), "stats": stats})
    for q in queues:
        histories[q]["snapshots"] = history(client, q, "snapshots")
        histories[q]["compactions"] = history(client, q, "compactions")
        after = None
        while len(histories[q]["messages"]) < browse_max:
            page = browse(client, q, after=after, limit=1000)
            histories[q]["messages"].extend(
                {"id": m.id, "published_at": m.published_at_ms, "delivery_count": m.delivery_count}
                for _, m in page
            )
            if len(page) < 1000:
                break
            after = page[-1][0]
    return {"exported_at": int(time.time() * 1000), "queues": list(histories.values())}


# --- analysing ----------------------------------------------------------------------


def analyse(history: dict[str, Any], now_ms: int) -> dict[str, Any]:
    """Tables (DataFrames) and the summary of one queue's history."""
    queue = history["queue"]
    samples = sorted(history.get("samples", []), key=lambda s: s["at_ms"])
    throughput = _throughput(queue, samples, history.get("snapshots", []))
    queued = _time_queued(queue, history, now_ms)
    compactions = _compactions(queue, history.get("compactions", []))
    live_dead = _live_dead(queue, samples)
    last = samples[-1]["stats"] if samples else {}
    summary = {
        "queue": queue,
        "generated_at_ms": now_ms,
        "throughput": _throughput_summary(throughput),
        "time_queued_ms": {
            state: _quantiles(queued.loc[queued["state"] == state, "queued_ms"])
            for state in ("consumed", "ready")
        },
        "redelivery_rate": _redelivery_rate(last, history.get("consumed", [])),
        "dead_letter_rate": _ratio(last.get("dead_lettered"), last.get("published")),
        "compaction": _compaction_summary(compactions, live_dead),
    }
    return {
        "summary": summary,
        "throughput": throughput,
        "time_queued": queued,
        "compactions": compactions,
        "live_dead": live_dead,
    }


def _ratio(num: Any, den: Any) -> float | None:
    if num is None or not den:
        return None
    return round(float(num) / float(den), 6)


def _throughput(queue: str, samples: list[dict[str, Any]], snapshots: list[Any]) -> pd.DataFrame:
    rows: list[dict[str, Any]] = []
    for a, b in itertools.pairwise(samples):
        seconds = (b["at_ms"] - a["at_ms"]) / 1000
        if seconds <= 0:
            continue
        row: dict[str, Any] = {"queue": queue, "window_start_ms": a["at_ms"]}
        row["window_end_ms"] = b["at_ms"]
        for counter, name in (("published", "published"), ("delivered", "delivered")):
            row[f"{name}_per_s"] = _delta(a, b, counter) / seconds
        row["acked_per_s"] = _delta(a, b, "acked") / seconds
        row["source"] = "stats"
        rows.append(row)
    if len(samples) == 1:
        s = samples[0]
        rows.append(
            {
                "queue": queue,
                "window_start_ms": s["at_ms"],
                "window_end_ms": s["at_ms"],
                "published_per_s": float(s["stats"].get("publish_rate") or 0.0),
                "delivered_per_s": float(s["stats"].get("deliver_rate") or 0.0),
                "acked_per_s": float(s["stats"].get("ack_rate") or 0.0),
                "source": "rates",
            }
        )
    snaps = sorted(snapshots, key=lambda r: to_ms(r["taken_at"]))
    for a, b in itertools.pairwise(snaps):
        start, end = to_ms(a["taken_at"]), to_ms(b["taken_at"])
        if end > start:
            rows.append(
                {
                    "queue": queue,
                    "window_start_ms": start,
                    "window_end_ms": end,
                    "log_entries_per_s": (b["index"] - a["index"]) / ((end - start) / 1000),
                    "source": "checkpoints",
                }
            )
    columns = ["queue", "window_start_ms", "window_end_ms", "published_per_s"]
    columns += ["delivered_per_s", "acked_per_s", "log_entries_per_s", "source"]
    return pd.DataFrame(rows, columns=columns).astype(
        {c: "float64" for c in columns[3:7]}
        | {"window_start_ms": "int64", "window_end_ms": "int64"}
    )


def _delta(a: dict[str, Any], b: dict[str, Any], counter: str) -> float:
    return float(b["stats"].get(counter) or 0) - float(a["stats"].get(counter) or 0)


def _throughput_summary(table: pd.DataFrame) -> dict[str, object]:
    stats = table[table["source"] != "checkpoints"]
    out: dict[str, object] = {"windows": len(stats)}
    for column in ("published_per_s", "delivered_per_s", "acked_per_s"):
        values = stats[column].dropna()
        out[f"mean_{column}"] = round(float(values.mean()), 3) if len(values) else None
        out[f"peak_{column}"] = round(float(values.max()), 3) if len(values) else None
    log_rates = table["log_entries_per_s"].dropna()
    out["mean_log_entries_per_s"] = round(float(log_rates.mean()), 3) if len(log_rates) else None
    return out


def _time_queued(queue: str, history: dict[str, Any], now_ms: int) -> pd.DataFrame:
    at_ms = now_ms
    samples = history.get("samples") or []
    if samples:
        at_ms = max(s["at_ms"] for s in samples)
    rows = [
        {
            "queue": queue,
            "id": int(m["id"]),
            "state": "consumed",
            "published_at_ms": to_ms(m["published_at"]),
            "queued_ms": to_ms(m["settled_at"]) - to_ms(m["published_at"]),
            "delivery_count": int(m.get("delivery_count", 1)),
        }
        for m in history.get("consumed", [])
    ]
    rows += [
        {
            "queue": queue,
            "id": int(m["id"]),
            "state": "ready",
            "published_at_ms": to_ms(m["published_at"]),
            "queued_ms": at_ms - to_ms(m["published_at"]),
            "delivery_count": int(m.get("delivery_count", 0)),
        }
        for m in history.get("messages", [])
    ]
    columns = ["queue", "id", "state", "published_at_ms", "queued_ms", "delivery_count"]
    return pd.DataFrame(rows, columns=columns).astype(
        {"id": "int64", "published_at_ms": "int64", "queued_ms": "int64", "delivery_count": "int64"}
    )


def _quantiles(values: pd.Series) -> dict[str, object]:
    if not len(values):
        return {"count": 0, "p50": None, "p95": None, "max": None}
    return {
        "count": len(values),
        "p50": round(float(values.quantile(0.5)), 3),
        "p95": round(float(values.quantile(0.95)), 3),
        "max": float(values.max()),
    }


def _redelivery_rate(last: dict[str, Any], consumed: list[dict[str, Any]]) -> float | None:
    if consumed:
        redelivered = sum(1 for m in consumed if int(m.get("delivery_count", 1)) > 1)
        return _ratio(redelivered, len(consumed))
    delivered = last.get("delivered")
    if not delivered:
        return None
    final = (
        float(last.get("acked") or 0)
        + float(last.get("dead_lettered") or 0)
        + float(last.get("messages_unacked") or 0)
    )
    return _ratio(max(0.0, float(delivered) - final), delivered)


def _compactions(queue: str, runs: list[dict[str, Any]]) -> pd.DataFrame:
    rows = []
    for r in sorted(runs, key=lambda r: to_ms(r["started_at"])):
        rows.append(
            {
                "queue": queue,
                "started_at_ms": to_ms(r["started_at"]),
                "phase": str(r["phase"]),
                "trigger": str(r.get("trigger", "")),
                "duration_ms": float(r.get("duration_ms") or 0.0),
                "segments_before": int(r["segments_before"]),
                "segments_after": int(r["segments_after"]),
                "bytes_before": int(r["bytes_before"]),
                "bytes_after": int(r["bytes_after"]),
                "bytes_reclaimed": int(r["bytes_before"]) - int(r["bytes_after"]),
                "live_entries": int(r["live_entries"]),
                "dead_entries_before": int(r["dead_entries_before"]),
                "dead_entries_after": int(r["dead_entries_after"]),
                "live_dead_ratio_before": _ratio(r["live_entries"], r["dead_entries_before"]),
                "live_dead_ratio_after": _ratio(r["live_entries"], r["dead_entries_after"]),
            }
        )
    columns = [
        "queue",
        "started_at_ms",
        "phase",
        "trigger",
        "duration_ms",
        "segments_before",
        "segments_after",
        "bytes_before",
        "bytes_after",
        "bytes_reclaimed",
        "live_entries",
        "dead_entries_before",
        "dead_entries_after",
        "live_dead_ratio_before",
        "live_dead_ratio_after",
    ]
    frame = pd.DataFrame(rows, columns=columns)
    return frame.astype({c: "int64" for c in columns[5:13]} | {"started_at_ms": "int64"}).astype(
        {"live_dead_ratio_before": "float64", "live_dead_ratio_after": "float64"}
    )


def _live_dead(queue: str, samples: list[dict[str, Any]]) -> pd.DataFrame:
    rows = []
    for s in samples:
        log = s["stats"].get("log") or {}
        live, dead = log.get("live_entries"), log.get("dead_entries")
        if live is None or dead is None:
            continue
        rows.append(
            {
                "queue": queue,
                "at_ms": s["at_ms"],
                "live_entries": int(live),
                "dead_entries": int(dead),
                "live_dead_ratio": _ratio(live, dead),
            }
        )
    columns = ["queue", "at_ms", "live_entries", "dead_entries", "live_dead_ratio"]
    return (
        pd.DataFrame(rows, columns=columns)
        .astype({"at_ms": "int64", "live_entries": "int64", "dead_entries": "int64"})
        .astype({"live_dead_ratio": "float64"})
    )


def _compaction_summary(runs: pd.DataFrame, live_dead: pd.DataFrame) -> dict[str, object]:
    reclaimed = runs["bytes_reclaimed"]
    before = int(runs["bytes_before"].sum())
    last_ratio = None
    if len(live_dead) and live_dead["live_dead_ratio"].notna().iloc[-1]:
        last_ratio = float(live_dead["live_dead_ratio"].iloc[-1])
    return {
        "runs": len(runs),
        "bytes_reclaimed_total": int(reclaimed.sum()),
        "bytes_reclaimed_per_run_mean": round(float(reclaimed.mean()), 3) if len(runs) else None,
        "reclaimed_fraction": _ratio(int(reclaimed.sum()), before),
        "live_dead_ratio_after_last_run": (
            None
            if not len(runs) or pd.isna(runs["live_dead_ratio_after"].iloc[-1])
            else float(runs["live_dead_ratio_after"].iloc[-1])
        ),
        "live_dead_ratio_now": last_ratio,
    }


# --- writing ------------------------------------------------------------------------


def write_report(export: dict[str, Any], out: Path, now_ms: int | None = None) -> dict[str, Any]:
    """Analyse every queue of ``export``; write Parquet tables and summaries to ``out``."""
    now_ms = int(export.get("exported_at") or time.time() * 1000) if now_ms is None else now_ms
    out.mkdir(parents=True, exist_ok=True)
    results = [analyse(h, now_ms) for h in export["queues"]]
    for table in TABLES:
        frames = [r[table] for r in results if len(r[table])]
        frame = pd.concat(frames, ignore_index=True) if frames else results[0][table].iloc[0:0]
        frame.to_parquet(out / f"{table}.parquet", index=False)
    summary = {
        "generated_at_ms": now_ms,
        "queues": {r["summary"]["queue"]: r["summary"] for r in results},
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    for r in results:
        queue_dir = out / r["summary"]["queue"]
        queue_dir.mkdir(exist_ok=True)
        text = json.dumps(r["summary"], indent=2, sort_keys=True) + "\n"
        (queue_dir / "summary.json").write_text(text)
    return summary
