"""``quorra pipeline report`` and ``quorra pipeline demo``.

    quorra pipeline report --server URL --token T [--queue Q ...] --out DIR
    quorra pipeline report --export history.json --out DIR
    quorra pipeline demo [--server URL --token T] [--rows N] [--out DIR] [--master M]

``demo`` without ``--server`` starts a throwaway local server (``quorra serve`` on
127.0.0.1 with a temporary data directory) and stops it at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from contextlib import nullcontext
from pathlib import Path
from typing import Any, TypedDict

from pipeline.options import DEFAULT_URL


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return int(args.run(args))
    except Exception as e:
        from quorra.client import Problem

        if isinstance(e, Problem | OSError | ValueError):
            print(f"error: {e}", file=sys.stderr)
            return 1
        raise


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="quorra pipeline", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command")

    report = sub.add_parser("report", help="queue analytics to Parquet and a JSON summary")
    report.add_argument("--server", default=os.environ.get("QUORRA_URL", DEFAULT_URL))
    report.add_argument("--token", default=os.environ.get("QUORRA_TOKEN", ""))
    report.add_argument("--queue", action="append", help="queue name (repeat; default all)")
    report.add_argument("--out", type=Path, required=True, help="output directory")
    report.add_argument("--export", type=Path, help="read this export instead of a server")
    report.add_argument("--save-export", type=Path, help="also write the fetched history here")
    report.add_argument("--samples", type=int, default=2, help="stats samples (default 2)")
    report.add_argument("--interval-s", type=float, default=1.0, help="between samples")
    report.add_argument("--browse-max", type=int, default=100_000, help="ready messages read")
    report.set_defaults(run=_report)

    demo = sub.add_parser("demo", help="Spark writes a dataset into a queue, streams it out")
    demo.add_argument("--server", help="server URL (default: start a local one)")
    demo.add_argument("--token", default=os.environ.get("QUORRA_TOKEN", ""))
    demo.add_argument("--queue", default="pipeline-demo")
    demo.add_argument("--rows", type=int, default=10_000)
    demo.add_argument("--out", type=Path, help="Parquet output directory (default: temporary)")
    demo.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    demo.set_defaults(run=_demo)
    return parser


def _report(args: argparse.Namespace) -> int:
    from pipeline.report import collect, write_report

    if args.export is not None:
        export: dict[str, Any] = json.loads(args.export.read_text())
    else:
        from pipeline import queues

        if not args.token:
            print("error: --token (or QUORRA_TOKEN) is required", file=sys.stderr)
            return 2
        with queues.connect(args.server, args.token) as client:
            names = args.queue or queues.queue_names(client)
            if not names:
                print("error: no queues to report on", file=sys.stderr)
                return 1
            export = collect(client, names, args.samples, args.interval_s, args.browse_max)
        if args.save_export is not None:
            args.save_export.write_text(json.dumps(export, default=str))
    if args.queue and args.export is not None:
        export["queues"] = [h for h in export["queues"] if h["queue"] in args.queue]
    if not export["queues"]:
        print("error: no queues to report on", file=sys.stderr)
        return 1
    summary = write_report(export, args.out)
    print(json.dumps({"out": str(args.out), "queues": sorted(summary["queues"])}))
    return 0


def _demo(args: argparse.Namespace) -> int:
    from pipeline.localserver import local_server

    if args.server and not args.token:
        print("error: --token is required with --server", file=sys.stderr)
        return 2
    server = nullcontext(None) if args.server else local_server()
    with server as local, tempfile.TemporaryDirectory(prefix="quorra-demo-") as tmp:
        url, token = (args.server, args.token) if local is None else (local.url, local.token)
        out = args.out or Path(tmp) / "out"
        counts = run_demo(url, token, args.queue, args.rows, out, Path(tmp) / "ck", args.master)
    print(json.dumps(counts))
    return 0 if counts["streamed_distinct"] == args.rows else 1


class DemoCounts(TypedDict):
    """What ``quorra pipeline demo`` prints: rows written, rows streamed back."""

    queue: str
    written: int
    streamed: int
    streamed_distinct: int
    batches: int
    stream_seconds: float
    parquet: str


def run_demo(
    url: str, token: str, queue: str, rows: int, out: Path, checkpoint: Path, master: str
) -> DemoCounts:
    from pipeline import queues
    from pipeline.jobs import generated_dataset, stream_to_parquet, write_queue
    from pipeline.session import spark_session

    with queues.connect(url, token) as client:
        queues.create_queue(client, queue)
    spark = spark_session(master, "quorra-pipeline-demo")
    options = {"url": url, "token": token, "queue": queue}
    write_queue(generated_dataset(spark, rows), options)
    run = stream_to_parquet(spark, options, out, checkpoint)
    result = spark.read.parquet(str(out))
    return {
        "queue": queue,
        "written": rows,
        "streamed": result.count(),
        "streamed_distinct": result.select("id").distinct().count(),
        "batches": run.batches,
        "stream_seconds": round(run.seconds, 2),
        "parquet": str(out),
    }
