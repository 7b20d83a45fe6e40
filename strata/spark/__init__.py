"""PySpark data sources over Strata topics (format ``strata``): batch and streaming reads of
both tiers, and a sink. Importing this package pulls in neither pyspark nor pyarrow; call
``register(spark)`` to make the format available::

    from strata.spark import register
    register(spark)
    df = (spark.read.format("strata")
          .option("bootstrap.servers", "127.0.0.1:9092").option("subscribe", "orders")
          .option("rsm.config.storage.url", "file:///data/kafka-logs/remote-storage")
          .load())                      # direct mode: remote segments from the object store
    df.write.format("strata").option("bootstrap.servers", "127.0.0.1:9092") \
        .option("topic", "copy").mode("append").save()

Options: ``strata.spark.options``; the source and sink: ``strata.spark.source`` and
``strata.spark.sink``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import Any

__all__ = ["register", "session"]


def register(spark: Any) -> None:
    """Register the ``strata`` data source with a SparkSession."""
    from strata.spark.source import StrataDataSource
    spark.dataSource.register(StrataDataSource)


def session(master: str, app: str, conf: Iterable[tuple[str, str]] = (), jars: Iterable[Any] = ()) -> Any:
    """A SparkSession (``getOrCreate``) whose Python workers run this interpreter, with
    ``conf``, ``jars`` as ``spark.jars``, and the ``strata`` source registered. Jars count only
    for the first session of a JVM."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    builder = SparkSession.builder.master(master).appName(app)
    for key, value in conf:
        builder = builder.config(key, value)
    jars = [str(j) for j in jars]
    if jars:
        builder = builder.config("spark.jars", ",".join(jars))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    register(spark)
    return spark
