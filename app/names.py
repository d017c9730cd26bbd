"""The queue-name rule as the app applies it: the engine's rule (engine/names.py),
re-exported for the routes, schemas, fast path, stream and dashboard, and read from a
URL's raw path segment.

One rule, so that a name the API accepts is one the engine accepts and the other way
round; the dashboard, the WebSocket handshake and the REST routes say the same thing
about a bad name (``QUEUE_NAME_RULE``).
"""

from __future__ import annotations

from urllib.parse import unquote

from engine.names import (
    QUEUE_NAME_CHARS_MAX,
    QUEUE_NAME_PATTERN,
    QUEUE_NAME_RULE,
    UNADDRESSABLE_QUEUE_NAMES,
    check_queue_name,
    is_queue_name,
)


def segment_queue_name(segment: bytes) -> str | None:
    """The queue name a raw (still percent-encoded) path segment addresses, or None
    when it addresses none. Routers see the path after percent-decoding, so
    ``..%2Fetc`` would be routed elsewhere: names are checked on the raw segment."""
    if b"%" in segment:
        name = unquote(segment.decode("latin-1"), errors="replace")
    else:
        name = segment.decode("latin-1")
    return name if is_queue_name(name) else None


__all__ = [
    "QUEUE_NAME_CHARS_MAX",
    "QUEUE_NAME_PATTERN",
    "QUEUE_NAME_RULE",
    "UNADDRESSABLE_QUEUE_NAMES",
    "check_queue_name",
    "is_queue_name",
    "segment_queue_name",
]
