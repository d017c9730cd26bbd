"""The dedup window of one queue: the dedup ids published recently, with the id of the
first message that carried each.

Rule of this module: a dedup id is remembered for ``window_ms`` of leader time from its
first publish, and at most ``ids_max`` ids are kept: beyond that the oldest are
forgotten early (the window shrinks, never grows). Ids are remembered in publish order,
which is also the order of their expiry, so forgetting is always from the front.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from engine.shared_empty import EMPTY_DICT, check_shared_empties


class DedupWindow:
    __slots__ = ("_first_ids", "_ids_max", "_order", "_window_ms")

    def __init__(self, window_ms: int, ids_max: int) -> None:
        self._window_ms = window_ms
        self._ids_max = ids_max
        self._first_ids: dict[bytes, int] = EMPTY_DICT
        """dedup id -> message id of the first message that carried it."""
        self._order: deque[tuple[int, bytes]] | None = None
        """(expiry ms, dedup id), oldest first; made by the first id remembered and
        dropped once empty (an empty deque holds 760 bytes, and most queues publish
        without dedup ids)."""

    def __len__(self) -> int:
        return len(self._first_ids)

    def prune(self, now_ms: int) -> None:
        """Forget the ids whose window ended at or before ``now_ms``."""
        order = self._order
        if order is None:
            return
        while order and order[0][0] <= now_ms:
            _expiry, key = order.popleft()
            del self._first_ids[key]
        if not order:
            self._order = None
            self._first_ids = EMPTY_DICT

    def find_duplicates(
        self, keys: list[tuple[int, bytes]], ids: list[int], duplicate: list[bool]
    ) -> None:
        """Mark the messages of a batch that repeat a remembered id or an earlier one of
        the same batch: ``duplicate[slot]`` becomes True and ``ids[slot]`` the first
        message's id. ``keys``: (slot, dedup id) of the messages that carry one."""
        seen: dict[bytes, int] = {}
        for k, key in keys:
            first = self._first_ids.get(key, seen.get(key))
            if first is not None:
                duplicate[k] = True
                ids[k] = first
            else:
                seen[key] = ids[k]

    def remember(
        self, keys: list[tuple[int, bytes]], ids: list[int], duplicate: list[bool], now_ms: int
    ) -> None:
        """Remember the ids of the batch's messages that are not duplicates."""
        expiry = now_ms + self._window_ms
        for k, key in keys:
            if duplicate[k]:
                continue
            if self._order is None:
                self._order = deque()
                self._first_ids = {}
            self._first_ids[key] = ids[k]
            self._order.append((expiry, key))
            if len(self._first_ids) > self._ids_max:
                _old, old_key = self._order.popleft()
                del self._first_ids[old_key]

    def to_wire(self) -> list[list[object]]:
        order = self._order or ()
        return [[expiry, key, self._first_ids[key]] for expiry, key in order]

    def adopt(self, wire: list[Any]) -> None:
        """Fill an empty window from ``to_wire``'s form."""
        assert not self._order
        if wire:
            self._order = deque((expiry, key) for expiry, key, _mid in wire)
            self._first_ids = {}
        for _expiry, key, mid in wire:
            self._first_ids[key] = mid

    def check(self) -> None:
        assert len(self._first_ids) == len(self._order or ())
        check_shared_empties()
        assert (self._order is None) == (self._first_ids is EMPTY_DICT)
        assert self._order is None or self._order, "an empty order is dropped"


__all__ = ["DedupWindow"]
