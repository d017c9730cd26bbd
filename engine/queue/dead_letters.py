"""The messages of one queue that wait for its dead-letter target to hold a copy.

Rule of this module: a message handed over stays here, out of the ready and pending
states, until the target confirms it (``encode_dead_letter_confirm``); every
``retry_ms`` of leader time without a confirmation its ``DeadLetter`` effect is emitted
again, so a copy lost with a leader is published again by the next one (the copies
carry dedup ids, so the target keeps one). Effects group messages by reason, reasons in
sorted order, messages in the order they were handed over.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from engine.queue.effects import DeadLetter
from engine.shared_empty import EMPTY_DICT

U64 = npt.NDArray[np.uint64]


class DeadLetters:
    __slots__ = ("_retry_ms", "_waiting")

    def __init__(self, retry_ms: int) -> None:
        self._retry_ms = retry_ms
        self._waiting: dict[int, tuple[str, int, int]] = EMPTY_DICT
        """ref -> (reason, delivery count, ms of the last DeadLetter effect)."""

    def __len__(self) -> int:
        return len(self._waiting)

    def hand_over(
        self, target: str, reason: str, refs: list[int], counts: tuple[int, ...], now_ms: int
    ) -> DeadLetter:
        """Hold ``refs`` (with their delivery counts) until confirmed; the effect that
        asks the runtime to publish their copies to ``target``."""
        if self._waiting is EMPTY_DICT:
            self._waiting = {}
        for ref, count in zip(refs, counts, strict=True):
            self._waiting[ref] = (reason, count, now_ms)
        return DeadLetter(target, reason, tuple(refs), counts)

    def retry(self, target: str | None, now_ms: int) -> list[DeadLetter]:
        """The effects again for the messages unconfirmed for ``retry_ms``."""
        due = now_ms - self._retry_ms
        by_reason: dict[str, list[tuple[int, int]]] = {}
        for ref, (reason, count, ms) in self._waiting.items():
            if ms <= due:
                by_reason.setdefault(reason, []).append((ref, count))
        effects: list[DeadLetter] = []
        for reason in sorted(by_reason):
            items = by_reason[reason]
            for ref, count in items:
                self._waiting[ref] = (reason, count, now_ms)
            assert target is not None
            refs = tuple(r for r, _ in items)
            effects.append(DeadLetter(target, reason, refs, tuple(c for _, c in items)))
        return effects

    def next_retry_ms(self) -> int | None:
        if not self._waiting:
            return None
        return min(ms for _r, _n, ms in self._waiting.values()) + self._retry_ms

    def confirm(self, refs: list[int]) -> list[int]:
        """Stop holding ``refs``; returns those that were held (others were confirmed
        before, or dropped)."""
        waiting = self._waiting
        return [ref for ref in refs if waiting.pop(ref, None) is not None]

    def refs(self) -> U64:
        """A new array of the refs held, in the order they were handed over."""
        return np.array(list(self._waiting), dtype=np.uint64)

    def clear(self) -> U64:
        """Stop holding every message (the target was removed); returns their refs."""
        refs = self.refs()
        self._waiting = EMPTY_DICT
        return refs

    def to_wire(self) -> list[list[object]]:
        return [[ref, *entry] for ref, entry in self._waiting.items()]

    def adopt(self, wire: list[Any]) -> None:
        """Fill an empty table from ``to_wire``'s form."""
        assert not self._waiting
        self._waiting = {ref: (reason, n, ms) for ref, reason, n, ms in wire} or EMPTY_DICT


__all__ = ["DeadLetters"]
