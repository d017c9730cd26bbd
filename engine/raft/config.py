"""Cluster membership: who votes and who only learns.

Rule: a configuration takes effect as soon as its entry is in a server's log, committed
or not (single-server changes, Raft thesis section 4.1); at most one change is uncommitted
at a time, so any two consecutive configurations share a majority.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import msgpack

from engine.ids import ServerId


@dataclass(frozen=True, slots=True)
class Configuration:
    voters: tuple[ServerId, ...]
    learners: tuple[ServerId, ...] = ()

    def __post_init__(self) -> None:
        assert list(self.voters) == sorted(set(self.voters)), "voters sorted and unique"
        assert list(self.learners) == sorted(set(self.learners)), "learners sorted and unique"
        assert not set(self.voters) & set(self.learners), "a server is voter or learner"

    @property
    def members(self) -> tuple[ServerId, ...]:
        return tuple(sorted(self.voters + self.learners))

    def with_learner(self, server: ServerId) -> Configuration:
        assert server not in self.members
        return Configuration(self.voters, tuple(sorted((*self.learners, server))))

    def with_voter(self, server: ServerId) -> Configuration:
        learners = tuple(s for s in self.learners if s != server)
        return Configuration(tuple(sorted({*self.voters, server})), learners)

    def without(self, server: ServerId) -> Configuration:
        return Configuration(
            tuple(s for s in self.voters if s != server),
            tuple(s for s in self.learners if s != server),
        )

    def encode(self) -> bytes:
        return bytes(msgpack.packb([list(self.voters), list(self.learners)]))

    @staticmethod
    def decode(data: bytes) -> Configuration:
        """The configuration this node encoded (in its log or a checkpoint)."""
        config = Configuration.parse(data)
        assert config is not None, "a configuration this node encoded"
        return config

    @staticmethod
    def parse(data: bytes) -> Configuration | None:
        """The configuration ``data`` encodes, or ``None`` if it encodes none (bytes
        from a peer): two lists of server ids, each sorted and unique, disjoint."""
        try:
            voters, learners = msgpack.unpackb(data)
        except (ValueError, TypeError, msgpack.UnpackException):
            return None
        if not (_sorted_ids(voters) and _sorted_ids(learners)) or set(voters) & set(learners):
            return None
        return Configuration(tuple(voters), tuple(learners))


def _sorted_ids(ids: object) -> bool:
    if type(ids) is not list or not all(type(s) is str for s in ids):
        return False
    return all(a < b for a, b in itertools.pairwise(ids))


EMPTY_CONFIGURATION = Configuration(())

__all__ = ["EMPTY_CONFIGURATION", "Configuration"]
