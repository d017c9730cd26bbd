"""A Quorra server for the browser tests: ``create_app`` with small storage limits, so
that a few hundred kilobytes of messages roll the WAL into several segments (the
segment map and compaction have something to show). Run as
``python -m tests.app.ui.serve DATA_DIR PORT``; SIGINT stops it."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import uvicorn

from app.main import create_app
from app.settings import Settings
from app.ui import series
from engine.limits import DEFAULT_LIMITS, KIB

SAMPLE_INTERVAL_S = 0.5
"""Charts get points within a short test (the dashboard samples every 5 s)."""
SMALL_LIMITS = replace(
    DEFAULT_LIMITS,
    wal_file_bytes_max=128 * KIB,
    wal_batch_bytes_max=128 * KIB,
    entry_bytes_max=128 * KIB,
    batch_bytes_max=64 * KIB,
    message_bytes_max=16 * KIB,
    message_bytes_max_ceiling=32 * KIB,
    segment_entries_max=64,
)


def main(argv: list[str]) -> None:
    data_dir, port = Path(argv[0]).resolve(), int(argv[1])
    data_dir.mkdir(parents=True, exist_ok=True)
    settings = replace(
        Settings.from_env(data_dir=data_dir, port=port),
        limits=SMALL_LIMITS,
        node_name="ui-test-node",
    )
    series.SAMPLE_INTERVAL_S = SAMPLE_INTERVAL_S
    app = create_app(settings)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main(sys.argv[1:])
