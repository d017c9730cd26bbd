"""A SparkSession for Quorra jobs, with the ``quorra`` data source registered.

Workers run ``PYSPARK_PYTHON``, which defaults to ``python3`` on the PATH, not this
virtualenv's interpreter (where pyarrow and this package live): it is set to
``sys.executable`` unless the caller set it. ``local[*]`` by default; any Spark master
through ``master``.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def spark_session(
    master: str = "local[*]",
    app_name: str = "quorra-pipeline",
    conf: dict[str, str] | None = None,
) -> SparkSession:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "4",
        "spark.driver.host": "127.0.0.1" if master.startswith("local") else "",
    }
    settings.update(conf or {})
    for key, value in settings.items():
        if value:
            builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    from pipeline.source import register

    register(spark)
    return spark
