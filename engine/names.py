"""The queue-name rule: the one place that says what a queue may be called.

A name is 1 to ``QUEUE_NAME_CHARS_MAX`` letters, digits, ``.``, ``_`` or ``-``, and
neither ``.`` nor ``..``: those two match the characters but are dot-segments in a URL
(RFC 3986), so no client could address them. The engine owns the rule (it checks every
name it is asked to create, and every dead-letter target); the app re-exports it
(app/names.py) for its routes, schemas, fast path and dashboard.
"""

from __future__ import annotations

import re

from engine.errors import ValidationFailed

QUEUE_NAME_CHARS_MAX = 200
QUEUE_NAME_PATTERN = rf"^[A-Za-z0-9._-]{{1,{QUEUE_NAME_CHARS_MAX}}}$"
"""For schemas (pydantic, OpenAPI): anchored, and without the dot-segment exception."""
UNADDRESSABLE_QUEUE_NAMES = frozenset({".", ".."})
QUEUE_NAME_RULE = (
    f"a queue name is 1-{QUEUE_NAME_CHARS_MAX} letters, digits, '.', '_' or '-' "
    "(and neither '.' nor '..')"
)

# fullmatch, not match: "$" also matches before a final newline.
_NAME = re.compile(rf"[A-Za-z0-9._-]{{1,{QUEUE_NAME_CHARS_MAX}}}")


def is_queue_name(name: object) -> bool:
    return (
        isinstance(name, str)
        and _NAME.fullmatch(name) is not None
        and name not in UNADDRESSABLE_QUEUE_NAMES
    )


def check_queue_name(name: object) -> None:
    """``ValidationFailed`` (422) unless ``name`` is a queue name."""
    if not is_queue_name(name):
        raise ValidationFailed(QUEUE_NAME_RULE)


__all__ = [
    "QUEUE_NAME_CHARS_MAX",
    "QUEUE_NAME_PATTERN",
    "QUEUE_NAME_RULE",
    "UNADDRESSABLE_QUEUE_NAMES",
    "check_queue_name",
    "is_queue_name",
]
