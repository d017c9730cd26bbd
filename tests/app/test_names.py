"""The one queue-name rule (engine/names.py), and its reading of a raw URL segment
(app/names.py)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.names import segment_queue_name
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
