"""``quick_init`` makes the same objects as the dataclass's own ``__init__``: equal, of
the same hash and ``repr``, frozen, checked by ``__post_init__``; it refuses a class
whose ``__init__`` it could not stand in for."""

from __future__ import annotations

import dataclasses
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.quick_init import quick_init


@dataclasses.dataclass(frozen=True, slots=True)
class Plain:
    index: int
    term: int
    data: bytes

    def __post_init__(self) -> None:
        assert self.index >= 1


@quick_init
@dataclasses.dataclass(frozen=True, slots=True)
class Quick:
    index: int
    term: int
    data: bytes

    def __post_init__(self) -> None:
        assert self.index >= 1


@given(st.integers(min_value=1), st.integers(), st.binary(max_size=8))
def test_the_same_object_as_the_dataclass_makes(index: int, term: int, data: bytes) -> None:
    quick, plain = Quick(index, term, data), Plain(index, term, data)
    assert dataclasses.astuple(quick) == dataclasses.astuple(plain)
    assert quick == Quick(index=index, term=term, data=data)
    assert hash(quick) == hash(Quick(index, term, data))
    assert repr(quick) == repr(plain).replace("Plain", "Quick")
    assert pickle.loads(pickle.dumps(quick)) == quick
    with pytest.raises(dataclasses.FrozenInstanceError):
        quick.index = index + 1  # type: ignore[misc]


def test_post_init_checks_and_arguments_are_the_dataclasss() -> None:
    with pytest.raises(AssertionError):
        Quick(0, 1, b"")
    with pytest.raises(TypeError):
        Quick(1, 2)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Quick(1, 2, b"", 3)  # type: ignore[call-arg]


def test_classes_it_cannot_stand_in_for_are_refused() -> None:
    @dataclasses.dataclass(frozen=True, slots=True)
    class Defaulted:
        index: int = 0

    @dataclasses.dataclass(slots=True)
    class Mutable:
        index: int

    @dataclasses.dataclass(frozen=True)
    class Unslotted:
        index: int

    for cls in (Defaulted, Mutable, Unslotted):
        with pytest.raises(AssertionError):
            quick_init(cls)
