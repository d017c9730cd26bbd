"""``bench cluster``'s split of a phase's server CPU by node: what each reading of the
phase's clock keeps, and the publish figure built from it."""

from __future__ import annotations

from typing import Any, cast

from bench.cluster import ClusterProcesses, NodeClocks, cpu_split


class FakeCluster:
    """CPU seconds by node, one dict per reading, in order."""

    def __init__(self, readings: list[dict[str, float]]) -> None:
        self.readings = readings

    def cpu_by_node(self) -> dict[str, float]:
        return self.readings.pop(0)


def clocks_of(*readings: dict[str, float]) -> NodeClocks:
    return NodeClocks(cast(ClusterProcesses, FakeCluster(list(readings))))


def test_the_clock_sums_the_nodes_and_splits_the_phase_by_node() -> None:
    clocks = clocks_of({"n1": 1.0, "n2": 2.0, "n3": 3.0}, {"n1": 1.5, "n2": 2.1, "n3": 3.2})
    assert clocks.cpu_s() == 6.0
    assert abs(clocks.cpu_s() - 6.8) < 1e-9
    assert clocks.us_per_msg(1000) == {"n1": 500.0, "n2": 100.0, "n3": 200.0}


def test_a_node_down_at_the_end_has_no_figure() -> None:
    clocks = clocks_of({"n1": 1.0, "n2": 2.0}, {"n1": 1.1})
    clocks.cpu_s()
    clocks.cpu_s()
    assert clocks.us_per_msg(100) == {"n1": 1000.0, "n2": None}
    assert clocks.us_per_msg(0) == {"n1": None, "n2": None}


def test_the_split_names_the_leader_and_each_follower() -> None:
    split: dict[str, Any] = cpu_split({"n1": 12.0, "n2": 30.5, "n3": 11.0}, "n2", 17.0)
    assert split == {
        "leader": 30.5,
        "followers": {"n1": 12.0, "n3": 11.0},
        "all": 53.5,
        "single_node": 17.0,
    }
    assert cpu_split({"n1": None, "n2": 3.0}, "n2", None)["all"] is None
