"""Pipelines over Strata topics, importable and runnable as ``strata spark JOB ...``:

- ``backfill(spark, topic, output_path, *, options, ...)``: a topic's history (or a time range)
  to Parquet, partitioned by UTC date (``strata.spark.pipelines.backfill``);
- ``audit(options, topic=None, ...)``: the remote log metadata reconciled with the object store
  (``strata.spark.pipelines.audit``);
- ``usage(options, topics=None, ...)``: local and remote bytes, segments and estimated costs per
  partition (``strata.spark.pipelines.usage``).

``options`` are the ``strata`` source's: ``bootstrap.servers`` and the remote tier
(``rsm.config.*`` keys, ``remote.log.storage.manager.class.name``, or
``strata.server.properties`` naming the broker's properties file). Importing this package
does not import pyspark; the Spark parts load when a job runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import sys
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from strata.common.types import TopicIdPartition
from strata.spark import session
from strata.tiered.api import (
    RemoteLogSegmentMetadata, RemotePartitionDeleteState, RemoteStorageException,
    RemoteStorageManager)

if TYPE_CHECKING:
    from strata.spark.broker_client import BrokerClient, TopicInfo

__all__ = [
    "AuditReport", "RemoteMetadata", "UsageReport", "add_arguments", "audit", "backfill",
    "bootstrap_servers", "load_remote_metadata", "open_client", "open_rsm", "remote_tier_options",
    "rsm_props", "run", "usage",
]


RSM_OPTION_PREFIXES = ("rsm.config.", "remote.log.storage.manager.")
SERVER_PROPERTIES_OPTION = "strata.server.properties"


# --------------------------------------------------------------------------- shared helpers


def bootstrap_servers(options: Mapping[str, str]) -> str:
    """``bootstrap.servers`` (or Spark's ``kafka.bootstrap.servers``) of the options."""
    for key in ("bootstrap.servers", "kafka.bootstrap.servers"):
        value = options.get(key)
        if value:
            return str(value)
    raise ValueError("option bootstrap.servers (or kafka.bootstrap.servers) is required")


def open_client(options: Mapping[str, str]) -> BrokerClient:
    from strata.spark.broker_client import BrokerClient
    return BrokerClient(bootstrap_servers(options), client_id="strata-pipelines")


def rsm_props(options: Mapping[str, str]) -> dict[str, str] | None:
    """The remote tier's broker-style RSM properties from the options, or None."""
    from strata.spark.remote_segments import rsm_props_from_options
    return rsm_props_from_options(dict(options))


def open_rsm(options: Mapping[str, str]) -> RemoteStorageManager:
    """The remote tier's RemoteStorageManager, built and configured as the broker builds it
    from the options' remote-tier keys; the caller closes it. ValueError when none is given."""
    from strata.spark.remote_segments import RemoteSegmentReader
    props = rsm_props(options)
    if props is None:
        raise ValueError("no remote tier configured: give rsm.config.* options (e.g. "
                         "rsm.config.storage.url) or strata.server.properties")
    return RemoteSegmentReader(props).rsm


@dataclasses.dataclass
class RemoteMetadata:
    """The replayed ``__remote_log_metadata`` of some topics: every segment not yet
    DELETE_SEGMENT_FINISHED (any other state), and the partitions whose remote data is being
    deleted (DELETE_PARTITION_MARKED or STARTED)."""

    segments: list[RemoteLogSegmentMetadata]
    deleting: set[TopicIdPartition]


def load_remote_metadata(client: BrokerClient, topics: Iterable[TopicInfo]) -> RemoteMetadata:
    """The topics' remote log metadata in every state, replayed as a broker's metadata manager
    replays it (``replay_remote_log_metadata``)."""
    from strata.spark.remote_segments import replay_remote_log_metadata
    store = replay_remote_log_metadata(client, topics)
    segments = [m for tip in store.partitions() for m in store.list_remote_log_segments(tip)]
    deleting = {tip for tip in store.partitions()
                if (d := store.delete_state(tip)) is not None
                and d.state is not RemotePartitionDeleteState.DELETE_PARTITION_FINISHED}
    return RemoteMetadata(segments, deleting)


# --------------------------------------------------------------------------- the CLI


def remote_tier_options(rsm: Iterable[str], server_properties: str | None) -> dict[str, str]:
    """Source options from ``--rsm KEY=VALUE`` (a bare key is an ``rsm.config.`` key:
    ``storage.url=file:///data/remote``) and ``--server-properties PATH``."""
    out: dict[str, str] = {}
    for item in rsm:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"--rsm expects KEY=VALUE, got {item!r}")
        if not key.startswith(RSM_OPTION_PREFIXES):
            key = RSM_OPTION_PREFIXES[0] + key
        out[key] = value.strip()
    if server_properties:
        out[SERVER_PROPERTIES_OPTION] = server_properties
    return out


def _timestamp(text: str) -> int:
    """Epoch milliseconds from an integer or an ISO-8601 date/time (UTC unless it says)."""
    text = text.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        when = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not epoch milliseconds or ISO-8601: {text!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return int(when.timestamp() * 1000)


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``strata spark`` subcommands: backfill, audit and usage."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--bootstrap-server", required=True, help="host:port of a Strata broker")
    common.add_argument("--rsm", action="append", default=[], metavar="KEY=VALUE",
                        help="remote tier setting; a bare key is an rsm.config. key "
                             "(storage.url=file:///...); repeatable")
    common.add_argument("--server-properties", metavar="PATH",
                        help="the broker's server.properties: its remote tier settings")
    common.add_argument("--option", action="append", default=[], type=_key_value,
                        metavar="KEY=VALUE", help="another strata source option; repeatable")
    spark_args = argparse.ArgumentParser(add_help=False)
    spark_args.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    spark_args.add_argument("--conf", action="append", default=[], type=_key_value,
                            metavar="KEY=VALUE", help="a Spark configuration; repeatable")
    jobs = parser.add_subparsers(dest="spark_job", required=True)

    p = jobs.add_parser("backfill", parents=[common, spark_args],
                        help="a topic's history (or a time range) to Parquet, by UTC date")
    p.add_argument("--topic", required=True)
    p.add_argument("--output", required=True, help="output directory or URI")
    p.add_argument("--start-timestamp", type=_timestamp, help="epoch ms or ISO-8601, inclusive")
    p.add_argument("--end-timestamp", type=_timestamp, help="epoch ms or ISO-8601, exclusive")
    p.add_argument("--write-mode", choices=("overwrite", "append", "overwrite-dates"),
                   default="overwrite", help="overwrite the output (default), append to it, or "
                                             "replace only the dates written")

    p = jobs.add_parser("audit", parents=[common, spark_args],
                        help="reconcile remote log metadata with the object store")
    p.add_argument("--topic", help="one topic (default: the whole store)")
    p.add_argument("--no-verify-crc", dest="verify_crc", action="store_false",
                   help="skip reading every chunk for its CRC32C")
    p.add_argument("--delete-orphans", action="store_true", help="delete the orphans found")
    p.add_argument("--grace-ms", type=int, default=None,
                   help="age after which an unfinished copy or delete is dangling (default 1 h)")
    p.add_argument("--spark", action="store_true", help="verify CRCs as a Spark job")
    p.add_argument("--json", action="store_true", help="print the report as JSON")

    p = jobs.add_parser("usage", parents=[common],
                        help="local and remote bytes, segments and estimated costs")
    p.add_argument("--topic", action="append", default=None,
                   help="a topic (repeatable; default: every non-internal topic)")
    p.add_argument("--metrics-url", help="the broker's metrics endpoint, for local segment counts")
    p.add_argument("--storage-price", type=float, default=0.023, help="$ per GiB-month")
    p.add_argument("--put-price", type=float, default=0.005, help="$ per 1000 PUT requests")
    p.add_argument("--get-price", type=float, default=0.0004, help="$ per 1000 GET requests")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def _options(args: argparse.Namespace) -> dict[str, str]:
    return {"bootstrap.servers": args.bootstrap_server,
            **remote_tier_options(args.rsm, args.server_properties), **dict(args.option)}


def run(args: argparse.Namespace) -> int:
    """Run the parsed ``strata spark JOB``: 0 when it succeeds (audit: nothing wrong left), 1
    when the audit found problems, 2 when the job cannot run."""
    try:
        options = _options(args)
        if args.spark_job == "usage":
            from strata.spark.pipelines.usage import usage as usage_job
            report = usage_job(options, args.topic, metrics_url=args.metrics_url,
                               storage_price_gb_month=args.storage_price,
                               put_price_per_1000=args.put_price,
                               get_price_per_1000=args.get_price)
            print(report.to_json() if args.json else report.format_table())
            return 0
        if args.spark_job == "audit":
            from strata.spark.pipelines.audit import DEFAULT_GRACE_MS
            from strata.spark.pipelines.audit import audit as audit_job
            spark = session(args.master, "strata-audit", args.conf) if args.spark else None
            try:
                result = audit_job(options, args.topic, verify_crc=args.verify_crc,
                                   delete_orphans=args.delete_orphans, spark=spark,
                                   grace_ms=DEFAULT_GRACE_MS if args.grace_ms is None
                                   else args.grace_ms)
            finally:
                if spark is not None:
                    spark.stop()
            print(result.to_json() if args.json else result.format_table())
            return 0 if result.ok else 1
        from strata.spark.pipelines.backfill import backfill as backfill_job
        spark = session(args.master, "strata-backfill", args.conf)
        try:
            rows = backfill_job(spark, args.topic, args.output, options=options,
                                start_timestamp=args.start_timestamp,
                                end_timestamp=args.end_timestamp, mode=args.write_mode)
        finally:
            spark.stop()
        print(json.dumps({"topic": args.topic, "output": args.output, "rows": rows}))
        return 0
    except (ValueError, LookupError, OSError, RemoteStorageException) as e:
        print(f"strata spark {args.spark_job}: {e}", file=sys.stderr)
        return 2


# The jobs, bound over their modules' names (a function and its module share a name).
from strata.spark.pipelines.audit import AuditReport, audit  # noqa: E402
from strata.spark.pipelines.backfill import backfill  # noqa: E402
from strata.spark.pipelines.usage import UsageReport, usage  # noqa: E402
