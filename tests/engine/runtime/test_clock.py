"""Steps of a node's wall clock: Raft timers do not see them, leader time never goes back."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from engine.limits import Limits
from engine.raft import election
from engine.raft.server import RaftServer
from engine.runtime import InMemoryNetwork, Node
from engine.runtime.api import QueueArgs
from engine.runtime.clock import SYSTEM_CLOCK
from tests.engine.runtime.test_cluster import NAMES, leader_name, retrying
from tests.engine.runtime.util import FAST, msgs, run

HOUR_MS = 3_600_000
QUEUE = "cq"


class SteppedClock:
    """The system's clocks, the wall clock stepped by ``wall_step_ms``."""

    def __init__(self) -> None:
        self.wall_step_ms = 0

    def monotonic_ms(self) -> int:
        return SYSTEM_CLOCK.monotonic_ms()

    def wall_ms(self) -> int:
        return SYSTEM_CLOCK.wall_ms() + self.wall_step_ms


async def clocked_cluster(
    root: Path, limits: Limits = FAST
) -> tuple[dict[str, Node], dict[str, SteppedClock], str]:
    """Three nodes with their own clocks and a queue on all three; its leader's name."""
    network = InMemoryNetwork(NAMES)
    clocks = {name: SteppedClock() for name in NAMES}
    nodes = {
        name: Node(
            root / name,
            node_name=name,
            limits=limits,
            transport=network.transport(name),
            clock=clocks[name],
        )
        for name in NAMES
    }
    await asyncio.gather(*(n.start() for n in nodes.values()))
    await nodes["n1"].create_queue(QUEUE, QueueArgs())
    leader = await retrying(lambda: leader_name(nodes, QUEUE))
    await retrying(lambda: nodes[leader].publish(QUEUE, msgs("first")))
    return nodes, clocks, leader


def term(node: Node) -> int:
    raft = node.stats(QUEUE)["raft"]
    assert isinstance(raft, dict)
    return int(raft["term"])


async def stop_all(nodes: dict[str, Node]) -> None:
    await asyncio.gather(*(n.stop() for n in nodes.values()), return_exceptions=True)


def test_a_leader_whose_wall_clock_steps_back_keeps_its_followers(tmp_path: Path) -> None:
    async def body() -> None:
        nodes, clocks, leader = await clocked_cluster(tmp_path)
        try:
            before = term(nodes[leader])
            clocks[leader].wall_step_ms = -HOUR_MS
            # Several election timeouts: a leader that stopped sending heartbeats is
            # replaced by then.
            await asyncio.sleep(4 * FAST.election_timeout_ms_max / 1000)
            assert await leader_name(nodes, QUEUE) == leader
            assert all(term(n) == before for n in nodes.values())
        finally:
            await stop_all(nodes)

    run(body())


def test_followers_whose_wall_clocks_step_back_elect_on_time(tmp_path: Path) -> None:
    async def body() -> None:
        nodes, clocks, leader = await clocked_cluster(tmp_path)
        try:
            for name in NAMES:
                clocks[name].wall_step_ms = -HOUR_MS
            await nodes[leader].halt()
            others = {name: n for name, n in nodes.items() if name != leader}
            loop = asyncio.get_running_loop()
            started = loop.time()
            new = await retrying(lambda: leader_name(others, QUEUE), timeout_s=5)
            assert new != leader
            assert loop.time() - started < 10 * FAST.election_timeout_ms_max / 1000
        finally:
            await stop_all(nodes)

    run(body())


def test_a_forward_step_of_the_wall_clock_starts_no_election(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    campaigns: list[str] = []
    campaign = election.campaign

    def counted(s: RaftServer, **kw: Any) -> None:
        campaigns.append(s.id)
        campaign(s, **kw)

    async def body() -> None:
        nodes, clocks, leader = await clocked_cluster(tmp_path)
        try:
            before = term(nodes[leader])
            monkeypatch.setattr(election, "campaign", counted)
            for name in NAMES:
                clocks[name].wall_step_ms = HOUR_MS
            await asyncio.sleep(4 * FAST.election_timeout_ms_max / 1000)
            assert campaigns == []
            assert await leader_name(nodes, QUEUE) == leader
            assert all(term(n) == before for n in nodes.values())
        finally:
            await stop_all(nodes)

    run(body())


def test_leader_time_never_goes_back_when_a_slower_clock_takes_over(tmp_path: Path) -> None:
    async def body() -> None:
        nodes, clocks, leader = await clocked_cluster(tmp_path)
        try:
            slow = next(name for name in NAMES if name != leader)
            clocks[slow].wall_step_ms = -HOUR_MS
            await nodes[leader].publish(QUEUE, msgs("before"))
            await retrying(lambda: nodes[leader].transfer_leadership(QUEUE, slow))
            await retrying(lambda: nodes[slow].publish(QUEUE, msgs("after")))
            browsed = await nodes[slow].browse(QUEUE, after=None, limit=10)
            assert [m.body for m in browsed] == [b"first", b"before", b"after"]
            times = [m.published_at_ms for m in browsed]
            assert times == sorted(times), times
            # Every entry applied by the machine carries a leader time, in log order.
            rep = nodes[slow].context.replicas[QUEUE]
            stamps = [rep.log.read(i).now_ms for i in range(1, rep.raft.log.last_index() + 1)]
            assert stamps == sorted(stamps), stamps
        finally:
            await stop_all(nodes)

    run(body())
