"""``quorra serve``: one uvicorn server on the given address, hosting ``create_app``."""

from __future__ import annotations

import gc
import sys
from typing import Any

import uvicorn

from app.http_protocol import http_protocol
from app.main import StartupReport, create_app
from app.memory_trim import libc
from app.settings import Settings, reachable
from app.ws_protocol import DirectFrameProtocol

REFUSED_EXIT_STATUS = 3
"""As a start that ``app.cluster_identity`` refuses: this node may not serve here."""


def announce(report: StartupReport) -> None:
    """Tell the operator where the server is and, on first start, how to log in."""
    url = reachable(report.base_url)
    lines = [f"Quorra is ready: dashboard {url}/  API {url}/api/v1"]
    if report.admin_created and report.admin_password is not None:
        lines.append(f"First start: log in as 'admin' with password: {report.admin_password}")
        lines.append("  (shown only now; change it with PATCH /api/v1/users/admin)")
    elif report.admin_created:
        lines.append("First start: log in as 'admin' with the password in QUORRA_ADMIN_PASSWORD")
    if report.cluster is not None:
        c = report.cluster
        lines.append(
            f"Cluster {c.cluster_id}: node {c.node_id}, peers connect to {c.listen}"
            f" (members {', '.join(c.members)})"
        )
    print("\n".join(lines), file=sys.stdout, flush=True)


_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
MALLOC_MMAP_THRESHOLD_BYTES = 256 * 1024
MALLOC_ARENAS_MAX = 2


def tune_malloc() -> bool:
    """Make glibc's malloc give the memory of large buffers back when they are freed.

    The server's large allocations are short-lived or released in bulk: request bodies,
    encoded publish batches (about 100 KiB for 100 messages of 1 KiB, held in the mem
    table until their WAL file is flushed to segments), WAL batches, segment files being
    written, stream frames. glibc raises its mmap threshold each time such a buffer is
    freed (up to 32 MiB), so the next ones come from the heap, whose freed space it
    keeps: with glibc's defaults a server that took 100,000 messages of 64 bytes kept 145
    B per message (139 with a fixed threshold of 1 MiB), against 47 with a threshold of
    64 KiB and 43 with 256 KiB (``quorra bench deep --messages 100000``). An idle queue
    cost the same under all four (``--queues 1000``: 11.7-13.4 KiB, 18.5-20.1 KiB after
    a restart, within the spread of two runs). A fixed threshold keeps the WAL batches and
    segment files, the buffers that pile up, in mappings of their own, returned to the
    system by ``free``; two arenas (not eight per core) keep the threads' small
    allocations from holding freed space in arenas of their own.

    The threshold is 256 KiB, not 64: a mapping costs an ``mmap``, page faults and a
    ``munmap`` per buffer, and the buffers of every batch of 100 messages of 1 KiB (its
    request body joined, the encoded entry, the answer) are over 64 KiB. Measured alone
    (one process, CPU time), joining, parsing and encoding a publish of 100 took 425-455
    us under 64 KiB against 180-205 under 256 KiB (150-185 with glibc's defaults), and
    reading and answering a receive of 100 took 265-270 us against 115-140: about 2.5
    and 1.3 us per message. Below 256 KiB such buffers come from the heap and
    are reused there; what they leave free is given back by the periodic
    ``malloc_trim`` (``app/memory_trim.py``).
    False where the C library is not glibc (nothing is changed there)."""
    mallopt = getattr(libc(), "mallopt", None)
    if mallopt is None:
        return False
    return bool(
        mallopt(_M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD_BYTES)
        and mallopt(_M_ARENA_MAX, MALLOC_ARENAS_MAX)
    )


GC_THRESHOLDS = (20_000, 20, 20)


def tune_gc() -> None:
    """Collect the youngest generation after 20,000 net allocations of tracked objects
    instead of 700. Requests make almost no cyclic garbage, but a collection resets the
    count, and the objects it promoted do not lower it when they die: under 700, single
    publishes (quorra bench rest, ``publish_batch_1``, two runs) ran 55-98 young and 5-8
    middle collections in 1,000-2,600 requests, 24-40 us of CPU per request (4-5%),
    walking the in-flight requests' live objects. Under 20,000 the same phase ran none
    (server CPU 487-626 us per request against 551-754, on a loaded machine).
    What start-up built is frozen out of the collector's sight (app/main.py), and the
    bound on uncollected cyclic garbage stays a number of objects."""
    gc.set_threshold(*GC_THRESHOLDS)


def websocket_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's WebSocket settings for the stream endpoint (app/api/stream.py):
    websockets' sans-I/O protocol, which reads no further frame until the app asks for
    one (the stream's back-pressure), with binary frames written as they are
    (app/ws_protocol.py); a frame as large as a request body; no compression
    (CPU for every frame, and message bodies are usually compressed already or small)."""
    return {
        "ws": DirectFrameProtocol,
        "ws_max_size": settings.request_body_bytes_max,
        "ws_per_message_deflate": False,
    }


def run_server(settings: Settings) -> None:
    """Serve until interrupted, with settings checked and settled (``settled_settings``,
    app/cluster_identity.py)."""
    tune_malloc()
    tune_gc()
    refused: list[str] = []
    server: uvicorn.Server | None = None

    def refuse(message: str) -> None:
        # The cluster forgot this node: stop serving, then exit as a refused start does.
        refused.append(message)
        if server is not None:
            server.should_exit = True

    app = create_app(settings, announce=announce, refuse=refuse)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
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
        **websocket_options(settings),
    )
    server = uvicorn.Server(config)
    server.run()
    if refused:
        print(f"quorra: {refused[0]}", file=sys.stderr, flush=True)
        sys.exit(REFUSED_EXIT_STATUS)
