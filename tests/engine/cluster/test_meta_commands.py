"""The metadata command encoding: every command round-trips, and anything that is not
exactly a command of the current format is ``InvalidRequest``, never another exception."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.cluster import meta_commands as mc
from engine.errors import InvalidRequest
from engine.queue import QueuePolicy

texts = st.text(max_size=20)
ints = st.integers(0, (1 << 63) - 1)
policies = st.builds(
    QueuePolicy,
    max_length=st.one_of(st.none(), ints),
    overflow=texts,
    dead_letter_queue=st.one_of(st.none(), texts),
    priorities=ints,
)
_VALUES: dict[str, st.SearchStrategy[Any]] = {"str": texts, "int": ints, "QueuePolicy": policies}
commands = st.one_of(
    [
        st.builds(cls, **{f.name: _VALUES[str(f.type)] for f in dataclasses.fields(cls)})  # type: ignore[arg-type]
        for cls in mc.COMMANDS
    ]
)


@given(commands)
def test_every_command_round_trips(command: mc.MetaCommand) -> None:
    assert mc.decode_command(mc.encode_command(command)) == command


def _body(command: mc.MetaCommand) -> list[Any]:
    doc: list[Any] = msgpack.unpackb(mc.encode_command(command), raw=False)
    return doc


def _pack(doc: object) -> bytes:
    return bytes(msgpack.packb(doc, use_bin_type=True))


CREATE = mc.CreateQueue("q", 3, QueuePolicy())


@pytest.mark.parametrize(
    "doc",
    [
        [2, "create_queue", _body(CREATE)[2]],  # another format version
        [True, "create_queue", _body(CREATE)[2]],  # True == 1, but not the version
        [1, "drop_table", {}],
        [1, "create_queue"],
        [1, "create_queue", {**_body(CREATE)[2], "extra": 1}],
        [1, "create_queue", {k: v for k, v in _body(CREATE)[2].items() if k != "replicas"}],
        [1, "create_queue", {**_body(CREATE)[2], "replicas": True}],
        [1, "create_queue", {**_body(CREATE)[2], "replicas": -1}],
        [1, "create_queue", {**_body(CREATE)[2], "replicas": 1.0}],
        [1, "create_queue", {**_body(CREATE)[2], "name": b"q"}],
        [1, "create_queue", {**_body(CREATE)[2], "name": "q" * (mc.NAME_CHARS_MAX + 1)}],
        [1, "create_queue", {**_body(CREATE)[2], "policy": {"lease_ms": 5}}],
        [1, "create_queue", {**_body(CREATE)[2], "policy": [1, 2]}],
        [
            1,
            "create_queue",
            {**_body(CREATE)[2], "policy": {**CREATE.policy.to_wire(), "priorities": None}},
        ],
        [
            1,
            "create_queue",
            {**_body(CREATE)[2], "policy": {**CREATE.policy.to_wire(), "max_length": False}},
        ],
        [1, "set_permissions", {"user": "u", "configure": "x" * 501, "write": "", "read": ""}],
        {"version": 1},
        "create_queue",
    ],
)
def test_malformed_documents_are_invalid_requests(doc: object) -> None:
    with pytest.raises(InvalidRequest):
        mc.decode_command(_pack(doc))


@given(st.binary(max_size=64))
def test_random_bytes_never_raise_anything_but_invalid_request(data: bytes) -> None:
    with contextlib.suppress(InvalidRequest):
        mc.decode_command(data)


def test_a_map_key_that_is_not_a_string_is_invalid() -> None:
    with pytest.raises(InvalidRequest):
        mc.decode_command(_pack([1, "delete_token", {1: "t"}]))


def test_trailing_bytes_are_invalid() -> None:
    with pytest.raises(InvalidRequest):
        mc.decode_command(mc.encode_command(mc.DeleteToken("t")) + b"\x00")
