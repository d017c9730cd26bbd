"""The bytes of what crosses a transport: msgpack, with frozen dataclasses as extension types.

Rule: every value a ``Transport`` carries (Raft messages, node-to-node calls
(``engine.runtime.routing``) and their answers, operating errors) encodes to one msgpack document and decodes to an
equal value. A dataclass is the extension type ``DATACLASS`` holding ``[type name,
[field values...]]`` in field order, rebuilt by field name; only the types registered here
decode, so a peer cannot make this node build anything else. An operating error travels as ``ERROR``: ``[class name,
detail]``. The in-memory transport can round-trip everything through this module
(``InMemoryNetwork(wire=True)``), so the tests prove what a TCP transport with msgpack
frames (a later issue) will carry.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import msgpack

from engine import errors
from engine.raft.entry import Entry, EntryKind
from engine.raft.messages import (
    AppendRequest,
    AppendResponse,
    Heartbeat,
    HeartbeatResponse,
    SnapshotChunk,
    SnapshotResponse,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)
from engine.runtime.api import (
    BrowsedMessage,
    OutgoingMessage,
    QueueArgs,
    QueueInfo,
    ReceivedMessage,
    SettleResult,
)
from engine.runtime.meta import QueueMeta
from engine.runtime.routing import CALL_TYPES

DATACLASS = 1
ERROR = 2

_TYPES: dict[str, type[Any]] = {
    cls.__name__: cls
    for cls in (
        AppendRequest,
        AppendResponse,
        Heartbeat,
        HeartbeatResponse,
        SnapshotChunk,
        SnapshotResponse,
        TimeoutNow,
        VoteRequest,
        VoteResponse,
        Entry,
        QueueMeta,
        QueueArgs,
        OutgoingMessage,
        ReceivedMessage,
        BrowsedMessage,
        SettleResult,
        QueueInfo,
        *CALL_TYPES,
    )
}
_FIELD_NAMES: dict[str, tuple[str, ...]] = {
    name: tuple(f.name for f in dataclasses.fields(cls)) for name, cls in _TYPES.items()
}
"""Values travel in field order and are rebuilt by name (some types take keywords only)."""
_ERRORS: dict[str, type[errors.QuorraError]] = {
    name: cls
    for name, cls in vars(errors).items()
    if isinstance(cls, type) and issubclass(cls, errors.QuorraError)
}
_FIXUPS: dict[str, Callable[[list[Any]], list[Any]]] = {
    "Entry": lambda f: [f[0], f[1], EntryKind(f[2]), f[3], f[4]],
    "QueueMeta": lambda f: [*f[:4], tuple(f[4])],
    "SettleResult": lambda f: [f[0], tuple(f[1])],
}
"""msgpack gives lists and ints back: restore tuples and enums where fields hold them."""


def _default(value: object) -> msgpack.ExtType:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        name = type(value).__name__
        assert _TYPES.get(name) is type(value), f"{name} is not a wire type"
        fields = [getattr(value, f.name) for f in dataclasses.fields(value)]
        return msgpack.ExtType(DATACLASS, encode([name, fields]))
    if isinstance(value, errors.QuorraError):
        return msgpack.ExtType(ERROR, encode([type(value).__name__, value.detail]))
    raise TypeError(f"cannot encode {type(value).__name__}")


def _ext_hook(code: int, data: bytes) -> object:
    if code == DATACLASS:
        name, fields = decode(data)
        cls = _TYPES.get(name)
        if cls is None:
            raise ValueError(f"not a wire type: {name!r}")
        fixup = _FIXUPS.get(name)
        values = fixup(fields) if fixup else fields
        names = _FIELD_NAMES[name]
        if len(values) != len(names):
            raise ValueError(f"{name}: {len(values)} fields, expected {len(names)}")
        return cls(**dict(zip(names, values, strict=True)))
    if code == ERROR:
        name, detail = decode(data)
        return _ERRORS.get(name, errors.QuorraError)(detail)
    raise ValueError(f"unknown extension type {code}")


def encode(value: object) -> bytes:
    return bytes(msgpack.packb(value, default=_default, use_bin_type=True))


def decode(data: bytes) -> Any:
    return msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=False)


__all__ = ["decode", "encode"]
