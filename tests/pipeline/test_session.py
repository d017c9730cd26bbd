"""The SparkSession's settings (no Spark started)."""

from __future__ import annotations

from pipeline.session import LOCAL_JAVA_OPTIONS, session_settings


def test_a_local_session_compiles_with_c1_only() -> None:
    for master in ("local[*]", "local[2]"):
        settings = session_settings(master)
        assert settings["spark.driver.extraJavaOptions"] == LOCAL_JAVA_OPTIONS
        assert "-XX:TieredStopAtLevel=1" in LOCAL_JAVA_OPTIONS.split()


def test_a_cluster_session_leaves_the_jvm_alone() -> None:
    assert not session_settings("spark://host:7077")["spark.driver.extraJavaOptions"]


def test_the_callers_java_options_replace_the_default() -> None:
    mine = {"spark.driver.extraJavaOptions": "-Xss4m"}
    assert session_settings("local[*]", mine)["spark.driver.extraJavaOptions"] == "-Xss4m"
    off = {"spark.driver.extraJavaOptions": ""}
    assert not session_settings("local[*]", off)["spark.driver.extraJavaOptions"]
