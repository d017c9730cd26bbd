"""MessagePack/JSON negotiation helpers, without a server."""

from __future__ import annotations

from datetime import UTC, datetime

import msgpack
import pytest
from starlette.requests import Request

from app.negotiation import MSGPACK_DEPTH_MAX, packb, respond, unpackb, wants_msgpack
from engine.errors import InvalidRequest


def _request(accept: str | None) -> Request:
    headers = [] if accept is None else [(b"accept", accept.encode())]
    return Request({"type": "http", "method": "GET", "path": "/", "headers": headers})


@pytest.mark.parametrize(
    ("accept", "msgpack_wanted"),
    [
        (None, False),
        ("*/*", False),
        ("application/json", False),
        ("application/msgpack", True),
        ("application/x-msgpack", True),
        ("application/vnd.msgpack", True),
        ("application/json, application/msgpack", False),  # a tie goes to JSON
        ("application/json;q=0.5, application/msgpack", True),
        ("application/msgpack;q=0.2, application/json", False),
        ("application/msgpack, */*;q=0.1", True),
        ("text/html, application/msgpack;q=0.9", True),
    ],
)
def test_wants_msgpack(accept: str | None, msgpack_wanted: bool) -> None:
    assert wants_msgpack(_request(accept)) is msgpack_wanted


def test_respond_keeps_bytes_in_msgpack_and_base64_in_json() -> None:
    payload = {"body": b"\x00\xff", "at": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), "n": 1}
    packed = respond(_request("application/msgpack"), payload, 201)
    assert packed.status_code == 201
    assert packed.media_type == "application/msgpack"
    assert msgpack.unpackb(packed.body) == {
        "body": b"\x00\xff",
        "at": "2026-01-02T03:04:05Z",
        "n": 1,
    }
    as_json = respond(_request(None), payload)
    assert as_json.media_type == "application/json"
    assert as_json.body == b'{"body":"AP8=","at":"2026-01-02T03:04:05Z","n":1}'


def test_unpackb_round_trip() -> None:
    value = {"messages": [{"body": b"\x01", "headers": {"k": "v"}, "priority": 2}]}
    assert unpackb(packb(value)) == value


@pytest.mark.parametrize(
    "raw",
    [
        b"\xc1",  # never used
        b"\x92\x01",  # an array of two with one item
        packb({"a": 1}) + b"\x01",  # trailing data
        b"\x81\x01\x02",  # an int map key
        b"\xa2\xff\xfe",  # a str that is not UTF-8
    ],
)
def test_unpackb_refuses_malformed_bodies(raw: bytes) -> None:
    with pytest.raises(InvalidRequest) as caught:
        unpackb(raw)
    assert caught.value.status == 400


def test_unpackb_refuses_deep_nesting() -> None:
    deep: object = 1
    for _ in range(40):
        deep = [deep]
    with pytest.raises(InvalidRequest, match="nests deeper"):
        unpackb(packb(deep))


def _deepest(value: object, depth: int = 0) -> int:
    """The depth of the deepest value inside ``value`` (the root is at 0)."""
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list):
        return max((_deepest(v, depth + 1) for v in value), default=depth)
    return depth


@pytest.mark.parametrize(
    "levels", [MSGPACK_DEPTH_MAX - 1, MSGPACK_DEPTH_MAX, MSGPACK_DEPTH_MAX + 1]
)
@pytest.mark.parametrize("bottom", [1, "r" * 64, [], {}, ["a", "b"], {"k": None}])
@pytest.mark.parametrize("wrap", ["list", "map"])
def test_unpackb_takes_exactly_what_lies_within_the_depth_bound(
    levels: int, bottom: object, wrap: str
) -> None:
    """Anything at most ``MSGPACK_DEPTH_MAX`` levels down is taken, scalar or container,
    and anything deeper refused, beside siblings that are shallow."""
    value: object = bottom
    for _ in range(levels):
        value = [value, "shallow"] if wrap == "list" else {"x": value, "y": 2}
    if _deepest(value) <= MSGPACK_DEPTH_MAX:
        assert unpackb(packb(value)) == value
    else:
        with pytest.raises(InvalidRequest, match="nests deeper"):
            unpackb(packb(value))
