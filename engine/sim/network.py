"""An in-memory network between simulated servers: delay, loss, duplication, reordering
(random delays) and partitions, all drawn from the one seeded random source."""

from __future__ import annotations

import random
from dataclasses import dataclass

from engine.ids import ServerId


@dataclass(frozen=True, slots=True)
class NetworkFaults:
    delay_ms_min: int = 1
    delay_ms_max: int = 10
    drop_per_mille: int = 0
    duplicate_per_mille: int = 0

    def __post_init__(self) -> None:
        assert 0 <= self.delay_ms_min <= self.delay_ms_max
        assert 0 <= self.drop_per_mille <= 1000 and 0 <= self.duplicate_per_mille <= 1000


class Network:
    def __init__(self, rng: random.Random, faults: NetworkFaults) -> None:
        self.rng = rng
        self.faults = faults
        self.blocked: set[tuple[ServerId, ServerId]] = set()

    def connected(self, src: ServerId, dst: ServerId) -> bool:
        return (src, dst) not in self.blocked

    def partition(self, groups: list[list[ServerId]]) -> None:
        """Cut every link between servers of different groups."""
        self.blocked = set()
        for i, a in enumerate(groups):
            for b in groups[i + 1 :]:
                for x in a:
                    for y in b:
                        self.blocked.add((x, y))
                        self.blocked.add((y, x))

    def heal(self) -> None:
        self.blocked = set()

    def delays_ms(self, src: ServerId, dst: ServerId) -> list[int]:
        """The delays of the copies of one message that will arrive (none if lost)."""
        f, rng = self.faults, self.rng
        if not self.connected(src, dst) or rng.randrange(1000) < f.drop_per_mille:
            return []
        copies = 2 if rng.randrange(1000) < f.duplicate_per_mille else 1
        return [rng.randint(f.delay_ms_min, f.delay_ms_max) for _ in range(copies)]


__all__ = ["Network", "NetworkFaults"]
