"""A small key-value machine whose values stay in the log (as Ra's ``ra_kv``).

The state maps each key to the index of the entry that holds its current value; a read
fetches that entry from the log. ``live_indexes`` is exactly those indexes, so every
other command entry is dead once a checkpoint covers it. Commands are msgpack arrays:
``["put", key, value]`` and ``["delete", key]``; the reply is the index of the entry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import msgpack
from pyroaring import BitMap64

from engine.raft.state_machine import ApplyMeta, MachineEffect

_unpackb = msgpack.unpackb


def encode_put(key: str, value: bytes) -> bytes:
    return bytes(msgpack.packb(["put", key, value], use_bin_type=True))


def encode_delete(key: str) -> bytes:
    return bytes(msgpack.packb(["delete", key], use_bin_type=True))


def decode_value(command: bytes) -> bytes:
    """The value carried by a ``put`` command entry (what a read returns)."""
    op, _key, value = msgpack.unpackb(command, raw=False)
    assert op == "put"
    return bytes(value)


def _decode(command: bytes) -> tuple[str, str] | None:
    """``(op, key)`` of a well-formed command, else ``None`` (the reply says so)."""
    try:
        op = _unpackb(command, raw=False)
    except (ValueError, msgpack.UnpackException):
        return None
    if type(op) is not list:
        return None
    n = len(op)
    if n == 3 and op[0] == "put" and type(op[1]) is str and type(op[2]) is bytes:
        return "put", op[1]
    if n == 2 and op[0] == "delete" and type(op[1]) is str:
        return "delete", op[1]
    return None


class KvMachine:
    version: ClassVar[int] = 1

    def __init__(self) -> None:
        self.keys: dict[str, int] = {}
        self.last_index = 0

    def apply(self, meta: ApplyMeta, command: bytes) -> tuple[object, list[MachineEffect]]:
        assert meta.index > self.last_index, "entries are applied once, in order"
        self.last_index = meta.index
        op = _decode(command)
        if op is None:
            return ("error", "malformed command"), []
        if op[0] == "put":
            self.keys[op[1]] = meta.index
        else:
            self.keys.pop(op[1], None)
        return ("ok", meta.index), []

    def get(self, key: str, read_entry: Callable[[int], bytes]) -> bytes | None:
        """The current value of ``key``; ``read_entry`` returns the data of a log entry."""
        index = self.keys.get(key)
        return None if index is None else decode_value(read_entry(index))

    def live_indexes(self) -> BitMap64:
        return BitMap64(self.keys.values())

    def snapshot(self) -> bytes:
        pairs = sorted(self.keys.items())
        return bytes(msgpack.packb([self.last_index, pairs], use_bin_type=True))

    def restore(self, data: bytes) -> None:
        last_index, pairs = msgpack.unpackb(data, raw=False)
        self.last_index = last_index
        self.keys = {k: i for k, i in pairs}


__all__ = ["KvMachine", "decode_value", "encode_delete", "encode_put"]
