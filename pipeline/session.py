"""A SparkSession for Quorra jobs, with the ``quorra`` data source registered.

Workers run ``PYSPARK_PYTHON``, which defaults to ``python3`` on the PATH, not this
virtualenv's interpreter (where pyarrow and this package live): it is set to
``sys.executable`` unless the caller set it. ``local[*]`` by default; any Spark master
through ``master``.

In local mode the driver's JVM runs every task, and it compiles with C1 only
(``LOCAL_JAVA_OPTIONS``): with tiered compilation, C2 compiler threads took 14-19 us of
CPU per row of a 200,000-row streaming read (of 34-44 us the JVM spent), on code that
would have needed far more rows to pay it back; C1 alone compiles for about 2 and the
tasks run about 4 slower. A ``spark.driver.extraJavaOptions`` in ``conf`` replaces it.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

LOCAL_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1"


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
    for key, value in session_settings(master, conf).items():
        if value:
            builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    from pipeline.source import register

    register(spark)
    return spark


def session_settings(master: str, conf: dict[str, str] | None = None) -> dict[str, str]:
    """The Spark settings of a session on ``master``, ``conf`` over the defaults; an
    empty value sets nothing."""
    local = master.startswith("local")
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "4",
        "spark.driver.host": "127.0.0.1" if local else "",
        "spark.driver.extraJavaOptions": LOCAL_JAVA_OPTIONS if local else "",
    }
    settings.update(conf or {})
    return settings
