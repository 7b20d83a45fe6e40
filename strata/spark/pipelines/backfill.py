"""The ``backfill`` pipeline: a topic's history, or a time range of it, to Parquet.

The topic is read with the ``strata`` source (``direct`` mode when the options name the remote
tier: remote segments straight from the object store, the local tail through Fetch), every
column of the source (headers included unless the options say ``includeHeaders=false``) plus
``date``, the UTC calendar date of the record timestamp as ``YYYY-MM-DD``, and written as Parquet
partitioned by ``date`` (``<output>/date=2024-05-01/part-...parquet``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["WRITE_MODES", "backfill", "utc_date_column"]

# overwrite: replace the whole output; append: add files; overwrite-dates: replace only the
# date partitions this run writes (Spark's dynamic partition overwrite).
WRITE_MODES = ("overwrite", "append", "overwrite-dates")
MS_PER_DAY = 86_400_000


def utc_date_column(timestamp_column: str = "timestamp") -> Any:
    """``YYYY-MM-DD`` of a timestamp column in UTC, whatever the session time zone: whole days
    since the epoch (from the epoch milliseconds) turned into a DATE, which formats without a
    time zone."""
    from pyspark.sql import functions as F
    days = F.floor(F.unix_millis(F.col(timestamp_column)) / MS_PER_DAY).cast("int")
    return F.date_format(F.date_from_unix_date(days), "yyyy-MM-dd")


def backfill(spark: Any, topic: str, output_path: str, *, options: Mapping[str, str],
             start_timestamp: int | None = None, end_timestamp: int | None = None,
             mode: str = "overwrite") -> int:
    """Write ``topic``'s records with ``start_timestamp <= timestamp < end_timestamp`` (epoch
    ms; either bound may be None: the whole history on that side) to Parquet under
    ``output_path``, partitioned by ``date``; returns the number of rows written.

    ``options``: the ``strata`` source's (``bootstrap.servers``, the remote tier, ...; the topic
    options are set here). The bounds become ``startingTimestamp``/``endingTimestamp`` (offsets
    from ListOffsets, so only that range is scanned) and a filter on ``timestamp`` (exact even
    where timestamps are out of order within the range). ``mode``: one of ``WRITE_MODES``.
    """
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    if mode not in WRITE_MODES:
        raise ValueError(f"mode must be one of {', '.join(WRITE_MODES)}, got {mode!r}")
    if start_timestamp is not None and end_timestamp is not None and end_timestamp <= start_timestamp:
        raise ValueError(f"end_timestamp {end_timestamp} must be after start_timestamp "
                         f"{start_timestamp}")
    opts = {k: str(v) for k, v in options.items()
            if k.lower() not in ("subscribe", "subscribepattern", "assign")}
    opts.setdefault("includeHeaders", "true")
    opts["subscribe"] = topic
    if start_timestamp is not None:
        opts["startingTimestamp"] = str(start_timestamp)
        # a start after the newest record is an empty range, not an error
        opts.setdefault("startingOffsetsByTimestampStrategy", "latest")
    else:
        opts.setdefault("startingOffsets", "earliest")
    if end_timestamp is not None:
        opts["endingTimestamp"] = str(end_timestamp)
    df = spark.read.format("strata").options(**opts).load()
    if start_timestamp is not None:
        df = df.where(F.unix_millis("timestamp") >= start_timestamp)
    if end_timestamp is not None:
        df = df.where(F.unix_millis("timestamp") < end_timestamp)
    written = Observation("backfill")
    df = df.withColumn("date", utc_date_column()).observe(written, F.count(F.lit(1)).alias("rows"))
    writer = df.write.partitionBy("date")
    if mode == "overwrite-dates":
        writer = writer.mode("overwrite").option("partitionOverwriteMode", "dynamic")
    else:
        writer = writer.mode(mode)
    writer.parquet(output_path)
    return int(written.get["rows"])
