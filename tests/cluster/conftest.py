"""``start_cluster(n)``: a cluster of ``n`` real server processes (``harness.Cluster``)
under the test's temporary directory, stopped with its proxies when the test ends."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.cluster.harness import Cluster


@pytest.fixture()
def start_cluster(tmp_path: Path) -> Iterator[Callable[[int], Cluster]]:
    clusters: list[Cluster] = []

    def start(size: int) -> Cluster:
        cluster = Cluster(tmp_path / f"cluster{len(clusters)}", size)
        clusters.append(cluster)
        return cluster.start()

    yield start
    for cluster in clusters:
        cluster.stop()
