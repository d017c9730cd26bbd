from __future__ import annotations

import dataclasses

import pytest

from engine.limits import DEFAULT_LIMITS, Limits


def test_default_limits_hold_their_relations() -> None:
    assert Limits() == DEFAULT_LIMITS


@pytest.mark.parametrize(
    "change",
    [
        {"election_timeout_ms_min": 50},
        {"page_refs": 1000},
        {"message_bytes_max": 64 * 1024 * 1024},
        {"checkpoints_kept_max": 1},
        {"cluster_send_buffer_bytes_max": 32 * 1024 * 1024},
        {"cluster_call_deadline_ms": 5_000},
    ],
)
def test_limits_reject_broken_relations(change: dict[str, int]) -> None:
    with pytest.raises(AssertionError):
        dataclasses.replace(DEFAULT_LIMITS, **change)
