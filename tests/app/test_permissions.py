"""RabbitMQ-style permission regexes: full match, empty permits nothing."""

from __future__ import annotations

import re
import tracemalloc

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.auth import Principal, pattern_error, permits, require
from app.problems import Forbidden

QUEUE_NAMES = st.from_regex(r"[A-Za-z0-9._-]{1,200}", fullmatch=True)


@pytest.mark.parametrize(
    ("pattern", "name", "allowed"),
    [
        ("", "orders", False),
        (".*", "orders", True),
        (".*", "a", True),
        ("orders", "orders", True),
        ("orders", "orders-dlq", False),  # a prefix is not a match
        ("orders", "my-orders", False),  # neither is a substring
        ("orders.*", "orders-dlq", True),
        (r"orders\..*", "orders.eu", True),
        (r"orders\..*", "orders-eu", False),
        ("a|b", "a", True),
        ("a|b", "ab", False),  # the alternation is anchored as a whole
        ("^orders$", "orders", True),
        ("[a-z]+", "Orders", False),
    ],
)
def test_permits_matches_the_whole_name(pattern: str, name: str, allowed: bool) -> None:
    assert permits(pattern, name) is allowed


@given(QUEUE_NAMES)
def test_an_escaped_name_permits_exactly_itself(name: str) -> None:
    assert permits(re.escape(name), name)
    assert not permits(re.escape(name), name + "x")
    assert not permits(re.escape(name), "x" + name)


@given(QUEUE_NAMES)
def test_empty_permits_nothing_and_dot_star_everything(name: str) -> None:
    assert not permits("", name)
    assert permits(".*", name)


@given(st.text(max_size=40))
def test_dot_star_answers_as_the_regular_expression_does(name: str) -> None:
    """``.*`` is answered without a regular expression (nor a cache entry per name): the
    same answer for any text, a newline included."""
    assert permits(".*", name) is (re.fullmatch(".*", name) is not None)


def test_dot_star_keeps_no_entry_per_name() -> None:
    """Thousands of queues named by requests under ``.*`` leave nothing behind."""
    before = tracemalloc.is_tracing()
    tracemalloc.start()
    try:
        names = [f"idle-{n:05}" for n in range(2_000)]
        start = tracemalloc.get_traced_memory()[0]
        for name in names:
            assert permits(".*", name)
        assert tracemalloc.get_traced_memory()[0] - start < 10_000
    finally:
        if not before:
            tracemalloc.stop()


def test_pattern_error() -> None:
    assert pattern_error("orders.*") is None
    assert pattern_error("") is None
    error = pattern_error("([")
    assert error is not None and error.startswith("not a regular expression")
    assert pattern_error("a" * 501) == "longer than 500 characters"


def _principal(**patterns: str) -> Principal:
    fields = {"configure": "", "write": "", "read": ""} | patterns
    return Principal(user_id=1, name="bob", role="user", **fields)


def test_require_checks_the_named_permission_only() -> None:
    bob = _principal(write="orders.*", read="events")
    require(bob, "write", "orders-1")
    require(bob, "read", "events")
    with pytest.raises(Forbidden) as caught:
        require(bob, "configure", "orders-1")
    assert caught.value.status == 403
    assert caught.value.problem_type == "/problems/forbidden"
    assert caught.value.detail == "user 'bob' has no configure permission on 'orders-1'"
    with pytest.raises(Forbidden):
        require(bob, "read", "orders-1")


def test_admin_role_does_not_bypass_permissions() -> None:
    root = Principal(user_id=1, name="root", role="admin", configure="", write="", read="")
    assert root.is_admin
    with pytest.raises(Forbidden):
        require(root, "write", "orders")
