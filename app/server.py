"""``quorra serve``: one uvicorn server on the given address, hosting ``create_app``."""

from __future__ import annotations

import sys
from pathlib import Path

import uvicorn

from app.http_protocol import http_protocol
from app.main import StartupReport, create_app
from app.settings import Settings, reachable


def announce(report: StartupReport) -> None:
    """Tell the operator where the server is and, on first start, how to log in."""
    url = reachable(report.base_url)
    lines = [f"Quorra is ready: dashboard {url}/  API {url}/api/v1"]
    if report.admin_created and report.admin_password is not None:
        lines.append(f"First start: log in as 'admin' with password: {report.admin_password}")
        lines.append("  (shown only now; change it with PATCH /api/v1/users/admin)")
    elif report.admin_created:
        lines.append("First start: log in as 'admin' with the password in QUORRA_ADMIN_PASSWORD")
    print("\n".join(lines), file=sys.stdout, flush=True)


def run_server(data_dir: Path, host: str, port: int) -> None:
    settings = Settings.from_env(data_dir=data_dir, host=host, port=port)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    app = create_app(settings, announce=announce)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        lifespan="on",
        log_level="info",
        access_log=False,
        server_header=False,
        proxy_headers=False,
        http=http_protocol(settings.header_read_timeout_s),
        # uvloop and httptools' parser: about a third less server CPU per small request
        # than asyncio's loop and h11 (quorra bench rest); "auto" keeps asyncio where
        # uvloop is missing.
        loop="auto",
    )
    uvicorn.Server(config).run()
