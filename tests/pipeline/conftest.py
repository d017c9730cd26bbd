"""Fixtures for the pipeline tests: one real ``quorra serve`` on 127.0.0.1 and one local
SparkSession for the whole test session (a Spark cold start costs seconds), and a fresh
queue per test.

The session is ``local[2,2]``: two threads, and a failed task is retried once (the
dedup-on-retry test needs a retry; plain ``local[2]`` never retries).
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline import queues
from pipeline.localserver import LocalServer, local_server
from quorra.client import Client

SPARK_MASTER = "local[2,2]"
_queue_numbers = itertools.count(1)

# PySpark warns about pandas 3 when it loads its pandas integration; that is PySpark's
# version check, not a problem of this code.
PYSPARK_PANDAS_WARNING = (
    "ignore:PySpark does not yet fully support pandas >= 3.0.0:FutureWarning:pyspark"
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.filterwarnings(PYSPARK_PANDAS_WARNING))


@pytest.fixture(scope="session")
def quorra_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    with local_server(tmp_path_factory.mktemp("pipeline-server")) as server:
        yield server


@pytest.fixture
def client(quorra_server: LocalServer) -> Iterator[Client]:
    with queues.connect(quorra_server.url, quorra_server.token) as c:
        yield c


@pytest.fixture
def queue(client: Client) -> str:
    name = f"pipeline-test-{next(_queue_numbers)}"
    queues.create_queue(client, name)
    return name


@pytest.fixture
def options(quorra_server: LocalServer, queue: str) -> dict[str, str]:
    return {"url": quorra_server.url, "token": quorra_server.token, "queue": queue}


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pipeline.session import spark_session

    session = spark_session(
        SPARK_MASTER,
        "quorra-pipeline-tests",
        conf={"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"},
    )
    yield session
    session.stop()
