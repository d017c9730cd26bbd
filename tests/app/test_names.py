"""The one queue-name rule (engine/names.py), and its reading of a raw URL segment
(app/names.py)."""

from __future__ import annotations

import asyncio
import gc
import re
import tracemalloc

import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.types import Message, Receive, Scope, Send

from app.names import segment_queue_name
from app.queue_api import QueueNameGuard
from engine.errors import ValidationFailed
from engine.names import QUEUE_NAME_PATTERN, QUEUE_NAME_RULE, check_queue_name, is_queue_name


@pytest.mark.parametrize(
    ("name", "valid"),
    [
        ("orders", True),
        ("a.b_c-D9", True),
        ("x" * 200, True),
        ("x" * 201, False),
        ("", False),
        (".", False),
        ("..", False),
        ("...", True),
        ("orders\n", False),  # "$" would let a final newline through
        ("a b", False),
        ("a/b", False),
        ("é", False),
        (5, False),
    ],
)
def test_the_rule(name: object, valid: bool) -> None:
    assert is_queue_name(name) is valid
    if valid:
        check_queue_name(name)
    else:
        with pytest.raises(ValidationFailed, match=re.escape(QUEUE_NAME_RULE)):
            check_queue_name(name)


@given(st.text(alphabet="ab.-_/%\n é", max_size=6))
def test_the_schema_pattern_states_the_rule_but_for_dot_segments(name: str) -> None:
    """What OpenAPI and pydantic say (the pattern) is the rule, less ``.`` and ``..``,
    which the app refuses on the raw path before any schema sees them."""
    in_pattern = re.fullmatch(QUEUE_NAME_PATTERN.strip("^$"), name) is not None
    assert is_queue_name(name) == (in_pattern and name not in (".", ".."))


@pytest.mark.parametrize(
    ("segment", "name"),
    [
        (b"orders", "orders"),
        (b"ord%65rs", "orders"),
        (b"..%2Fetc", None),
        (b"%2E", None),
        (b"%2e%2E", None),
        (b"a%20b", None),
        (b"a%0A", None),
        (b"%C3%A9", None),
        (b"\xc3\xa9", None),
        (b"", None),
    ],
)
def test_a_raw_segment_names_a_queue_once_decoded(segment: bytes, name: str | None) -> None:
    assert segment_queue_name(segment) == name


def test_the_guard_remembers_only_valid_segments_and_a_bounded_number() -> None:
    passed: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        passed.append(scope["path"])

    async def receive() -> Message:
        return {"type": "http.request", "body": b""}

    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    guard = QueueNameGuard(app)
    guard.NAMES_MAX = 3

    def request(segment: str) -> None:
        path = f"/api/v1/queues/{segment}/messages"
        scope = {"type": "http", "path": path, "raw_path": path.encode(), "headers": []}
        asyncio.run(guard(scope, receive, send))

    for segment in ("a", "a", "..", "b", "c", "d", "..", "a%20b", "d"):
        request(segment)
    assert [p.split("/")[4] for p in passed] == ["a", "a", "b", "c", "d", "d"]
    assert [m["status"] for m in sent if m["type"] == "http.response.start"] == [422] * 3
    assert len(guard._valid) <= guard.NAMES_MAX and b".." not in guard._valid


def test_the_guard_remembers_a_bounded_few_names() -> None:
    """Thousands of queues named once each (idle queues, each created and published
    to) leave the guard holding a few hundred names, not one for each queue."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        return None

    async def receive() -> Message:
        return {"type": "http.request", "body": b""}

    async def send(message: Message) -> None:
        return None

    guard = QueueNameGuard(app)

    async def requests(names: list[str]) -> None:
        for name in names:
            path = f"/api/v1/queues/{name}/messages"
            scope = {"type": "http", "path": path, "raw_path": path.encode(), "headers": []}
            await guard(scope, receive, send)

    asyncio.run(requests(["warm"]))
    names = [f"bench-idle-{n:05d}" for n in range(3_000)]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        asyncio.run(requests(names))
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept < 60_000, kept  # 256 names at most; 278 KB of these 3,000 when 4,096 were kept
