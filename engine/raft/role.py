"""The role a Raft server plays in its current term."""

from __future__ import annotations

from enum import IntEnum


class Role(IntEnum):
    FOLLOWER = 0
    PRE_CANDIDATE = 1
    CANDIDATE = 2
    LEADER = 3


__all__ = ["Role"]
