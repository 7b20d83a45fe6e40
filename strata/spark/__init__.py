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

from typing import Any

__all__ = ["register"]


def register(spark: Any) -> None:
    """Register the ``strata`` data source with a SparkSession."""
    from strata.spark.source import StrataDataSource
    spark.dataSource.register(StrataDataSource)
