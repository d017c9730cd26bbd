"""``quorra serve``: one uvicorn server on the given address, hosting ``create_app``."""

from __future__ import annotations

import sys
from pathlib import Path

import uvicorn

from app.http_protocol import http_protocol
from app.main import StartupReport, create_app
from app.memory_trim import libc
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


_M_ARENA_MAX = -8
MALLOC_ARENAS_MAX = 2


def tune_malloc() -> bool:
    """Two malloc arenas, not eight per core: each thread's small allocations would
    otherwise keep freed space in an arena of its own. Freed heap goes back to the system
    through ``app/memory_trim.py``'s periodic ``malloc_trim``; large buffers (request
    bodies, encoded batches, WAL writes) stay on the heap, where they are reused: sending
    each to a mapping of its own (a fixed mmap threshold of 64 KiB) cost a mapping, an
    unmapping and page faults per request, a fifth of the batch publish rate (``quorra
    bench rest``: 60k against 78-90k msgs/s), for no gain in memory (``quorra bench
    restart``: 12.7 and 13.1 B per queued message). False where the C library is not
    glibc (nothing is changed there)."""
    mallopt = getattr(libc(), "mallopt", None)
    if mallopt is None:
        return False
    return bool(mallopt(_M_ARENA_MAX, MALLOC_ARENAS_MAX))


def run_server(data_dir: Path, host: str, port: int) -> None:
    tune_malloc()
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
