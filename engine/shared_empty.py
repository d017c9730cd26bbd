"""One empty dict and one empty list, shared by every container that holds nothing yet;
and one object for equal immutable values (``shared``).

Most queues of a node are idle, and an idle queue's objects would each hold their own
empty dicts and lists (64-100 bytes each, a few dozen per queue): instead, a field that
is empty most of the time starts as ``EMPTY_DICT`` or ``EMPTY_LIST``, its owner takes a
container of its own before it adds the first item (``if x is EMPTY_DICT: x = {}``),
and may give it back once empty again. Nothing ever adds to the shared ones:
``check_shared_empties`` says so, and every ``check``/``check_invariants`` that relies
on them calls it.
"""

from __future__ import annotations

from typing import Any, TypeVar, cast

EMPTY_DICT: dict[Any, Any] = {}
EMPTY_LIST: list[Any] = []


def empty_dict() -> dict[Any, Any]:
    """``EMPTY_DICT``, as a dataclass field's ``default_factory``."""
    return EMPTY_DICT


def empty_list() -> list[Any]:
    """``EMPTY_LIST``, as a dataclass field's ``default_factory``."""
    return EMPTY_LIST


_T = TypeVar("_T")
_SHARED: dict[object, object] = {}
SHARED_MAX = 4096
"""Distinct values ``shared`` keeps (a node's queues use a handful of arguments, member
lists and policies); past this many, a new value stays its owner's own."""


def shared(value: _T) -> _T:
    """The one object kept for values equal to ``value`` (``value`` itself the first
    time): immutable parts that thousands of idle queues would each hold a copy of."""
    got = _SHARED.get(value)
    if got is not None:
        return cast(_T, got)
    if len(_SHARED) < SHARED_MAX:
        _SHARED[value] = value
    return value


def check_shared_empties() -> None:
    assert not EMPTY_DICT and not EMPTY_LIST, "a shared empty container was changed"


__all__ = [
    "EMPTY_DICT",
    "EMPTY_LIST",
    "SHARED_MAX",
    "check_shared_empties",
    "empty_dict",
    "empty_list",
    "shared",
]
