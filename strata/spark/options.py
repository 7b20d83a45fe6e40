"""Options of the ``strata`` Spark source and sink, parsed and checked at plan time.

The names and meanings follow Spark's Kafka source (``KafkaSourceProvider``), so a job moves
from ``format("kafka")`` to ``format("strata")`` by changing the format:

=====================================  =============================================================
``kafka.bootstrap.servers`` or         the broker(s), ``host:port[,host:port...]`` (required)
``bootstrap.servers``
``subscribe`` / ``subscribePattern``   exactly one: topics (comma-separated), a Java-style regex
/ ``assign``                           matched against whole topic names (internal ``__`` topics
                                       excluded), or JSON ``{"topicA":[0,1]}``
``startingOffsets``                    ``earliest``, ``latest`` or JSON ``{"t":{"0":23,"1":-2}}``
                                       (-2 earliest, -1 latest); batch default earliest (latest
                                       refused), streaming default latest
``endingOffsets``                      batch only: ``latest`` (default) or JSON (-1 latest; -2
                                       refused); exclusive
``startingTimestamp`` /                one epoch-ms timestamp for every partition: the first offset
``endingTimestamp``                    whose timestamp is >= it (they win over the options below)
``startingOffsetsByTimestamp`` /       JSON ``{"t":{"0":1700000000000}}``, per partition
``endingOffsetsByTimestamp``
``startingOffsetsByTimestampStrategy`` ``error`` (default: fail when no record is that recent) or
                                       ``latest`` (start at the latest offset instead)
``failOnDataLoss``                     ``true`` (default): fail when requested offsets or remote
                                       objects are gone; ``false``: skip them with a warning
``includeHeaders``                     ``false`` (default): add the ``headers`` column when true
``maxOffsetsPerTrigger``               streaming: at most this many offsets per micro-batch, split
                                       over partitions in proportion to their backlog
``minPartitions``                      at least about this many input partitions (as in Spark's
                                       Kafka source): the largest are cut in two -- between remote
                                       segments, else at the offset-index entry nearest a segment's
                                       middle, else a Fetch range in half -- until there are. Unset
                                       (default): ``direct`` mode reads each topic-partition's
                                       remote segments and local tail in input partitions of up to
                                       ``maxBytesPerPartition``; set it to the number of cores
                                       (``spark.sparkContext.defaultParallelism``) to use them all
                                       on a topic with fewer partitions
``maxRecordsPerPartition``             split ranges read through Fetch into input partitions of at
                                       most about this many offsets (default 1,000,000)
``maxBytesPerPartition``               ``direct`` mode: an input partition reads consecutive remote
                                       segments of one topic-partition (and its local tail) up to
                                       about this many bytes, the partition's share split evenly;
                                       larger segments are cut at offset-index entries (default
                                       1 GiB: every input partition costs a Spark task and a Python
                                       worker round trip, about 0.1 s, so few large ones read
                                       fastest)
``mode``                               ``direct`` (remote segments straight from the object store,
                                       the local tail through Fetch; the default when a remote tier
                                       is configured) or ``broker`` (everything through Fetch)
``kafkaConsumer.pollTimeoutMs``        broker request timeout (default 30000)
``fetch.max.bytes``                    bytes asked per Fetch (default 8 MiB)
``checkCrc``                           ``true`` (default): verify each batch's CRC32C, except in
                                       remote segments whose RSM vouches for them (Strata's checks
                                       every batch at upload and every chunk read)
remote tier                            ``rsm.config.*``, ``remote.log.storage.manager.*`` or
                                       ``strata.server.properties`` (see ``remote_segments``)
=====================================  =============================================================

Sink: the bootstrap option, optional ``topic`` (overrides the ``topic`` column), and ``kafka.*``
keys passed to the producer (prefix stripped; idempotence and ``acks=all`` are fixed).

Spark hands Python data sources their options with lower-cased keys; everything here looks
keys up case-insensitively. Errors are ``StrataOptionError`` (a ``ValueError``) with a message
naming the option, raised on the driver before any task runs.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

__all__ = [
    "DEFAULT_FETCH_MAX_BYTES", "DEFAULT_MAX_BYTES_PER_PARTITION", "DEFAULT_MAX_RECORDS_PER_PARTITION",
    "EARLIEST", "LATEST", "OffsetSpec", "SinkOptions", "SourceOptions", "StrataOptionError",
    "parse_sink_options", "parse_source_options",
]

EARLIEST, LATEST = -2, -1
DEFAULT_MAX_BYTES_PER_PARTITION = 1024 * 1024 * 1024
DEFAULT_MAX_RECORDS_PER_PARTITION = 1_000_000
DEFAULT_FETCH_MAX_BYTES = 8 * 1024 * 1024
DEFAULT_TIMEOUT_MS = 30_000
MODES = ("direct", "broker")
STRATEGY_OPTIONS = ("subscribe", "subscribepattern", "assign")

_ASSIGN_EXAMPLE = '{"topicA":[0,1],"topicB":[0,1]}'
_OFFSETS_EXAMPLE = '{"topicA":{"0":23,"1":-1},"topicB":{"0":-2}}'
_TIMESTAMPS_EXAMPLE = '{"topicA":{"0":1700000000000,"1":1700000000000}}'


class StrataOptionError(ValueError):
    """An option of the strata source or sink is missing, unknown or malformed."""


@dataclass(frozen=True)
class OffsetSpec:
    """Where a read starts or ends, before it is resolved against the broker.

    ``kind`` is ``earliest``, ``latest``, ``offsets`` (``per_partition`` holds offsets, -2/-1
    meaning earliest/latest), ``timestamp`` (``timestamp`` for every partition) or
    ``timestamps`` (``per_partition`` holds epoch-ms timestamps)."""

    kind: str
    per_partition: Mapping[str, Mapping[int, int]] = field(default_factory=dict)
    timestamp: int | None = None


@dataclass(frozen=True)
class SourceOptions:
    """The parsed options of a read (batch when ``streaming`` is false)."""

    bootstrap_servers: str
    streaming: bool
    subscribe: tuple[str, ...] = ()
    subscribe_pattern: str | None = None
    assign: Mapping[str, tuple[int, ...]] | None = None
    starting: OffsetSpec = OffsetSpec("earliest")
    ending: OffsetSpec = OffsetSpec("latest")
    start_timestamp_strategy: str = "error"
    fail_on_data_loss: bool = True
    include_headers: bool = False
    max_offsets_per_trigger: int | None = None
    min_partitions: int | None = None
    max_records_per_partition: int = DEFAULT_MAX_RECORDS_PER_PARTITION
    max_bytes_per_partition: int = DEFAULT_MAX_BYTES_PER_PARTITION
    fetch_max_bytes: int = DEFAULT_FETCH_MAX_BYTES
    timeout_s: float = DEFAULT_TIMEOUT_MS / 1000
    check_crc: bool = True
    mode: str = "broker"
    rsm_props: Mapping[str, str] | None = None

    def topic_matches(self, topic: str) -> bool:
        """Whether ``topic`` belongs to this read's subscription (assign: its topics)."""
        if self.subscribe_pattern is not None:
            return (not topic.startswith("__")
                    and re.fullmatch(self.subscribe_pattern, topic) is not None)
        if self.assign is not None:
            return topic in self.assign
        return topic in self.subscribe


@dataclass(frozen=True)
class SinkOptions:
    """The parsed options of a write."""

    bootstrap_servers: str
    topic: str | None = None
    producer_config: Mapping[str, str] = field(default_factory=dict)


# ---- helpers ------------------------------------------------------------------------------------

def _lower(options: Mapping[str, Any]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items() if v is not None}


def _bool(opts: Mapping[str, str], key: str, name: str, default: bool) -> bool:
    raw = opts.get(key)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise StrataOptionError(f"Option '{name}' must be true or false, got '{raw}'")
    return value == "true"


def _positive_int(opts: Mapping[str, str], key: str, name: str, default: int | None) -> int | None:
    raw = opts.get(key)
    if raw is None:
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise StrataOptionError(f"Option '{name}' must be a positive integer, got '{raw}'") from None
    if value <= 0:
        raise StrataOptionError(f"Option '{name}' must be a positive integer, got '{raw}'")
    return value


def _timestamp(raw: str, name: str) -> int:
    try:
        value = int(raw.strip())
    except ValueError:
        value = -1
    if value < 0:
        raise StrataOptionError(f"Option '{name}' must be a timestamp in milliseconds since the "
                                f"epoch (a non-negative integer), got '{raw}'")
    return value


def bootstrap_servers(options: Mapping[str, Any]) -> str:
    """``kafka.bootstrap.servers`` or ``bootstrap.servers`` (the first wins when both are set)."""
    opts = _lower(options)
    value = (opts.get("kafka.bootstrap.servers") or opts.get("bootstrap.servers") or "").strip()
    if not value:
        raise StrataOptionError("Option 'kafka.bootstrap.servers' (or 'bootstrap.servers') must "
                                "be specified: the broker addresses, host:port[,host:port...]")
    return value


def parse_assign(raw: str) -> dict[str, tuple[int, ...]]:
    """``{"topicA":[0,1]}`` as {topic: partitions}."""
    try:
        doc = json.loads(raw)
    except ValueError:
        doc = None
    if (not isinstance(doc, dict) or not doc
            or not all(isinstance(ps, list) and all(type(p) is int and p >= 0 for p in ps)
                       for ps in doc.values())):
        raise StrataOptionError(f"Option 'assign': expected e.g. {_ASSIGN_EXAMPLE}, got {raw}")
    return {str(t): tuple(sorted(set(ps))) for t, ps in doc.items()}


def parse_partition_map(raw: str, name: str, example: str) -> dict[str, dict[int, int]]:
    """``{"t":{"0":23}}`` as {topic: {partition: number}}."""
    try:
        doc = json.loads(raw)
    except ValueError:
        doc = None
    out: dict[str, dict[int, int]] = {}
    ok = isinstance(doc, dict) and bool(doc)
    if ok:
        for topic, parts in doc.items():
            if not isinstance(parts, dict) or not parts:
                ok = False
                break
            entry: dict[int, int] = {}
            for p, v in parts.items():
                if not (isinstance(p, str) and p.isdigit()) or type(v) is not int:
                    ok = False
                    break
                entry[int(p)] = v
            out[str(topic)] = entry
    if not ok:
        raise StrataOptionError(f"Option '{name}': expected e.g. {example}, got {raw}")
    return out


def _offsets_spec(opts: Mapping[str, str], role: str, streaming: bool) -> OffsetSpec:
    """The starting (``role`` = starting) or ending spec, by Spark's precedence: the global
    timestamp, then per-partition timestamps, then offsets."""
    name_ts = f"{role}Timestamp"
    name_by_ts = f"{role}OffsetsByTimestamp"
    name_offsets = f"{role}Offsets"
    if (raw := opts.get(name_ts.lower())) is not None:
        return OffsetSpec("timestamp", timestamp=_timestamp(raw, name_ts))
    if (raw := opts.get(name_by_ts.lower())) is not None:
        per = parse_partition_map(raw, name_by_ts, _TIMESTAMPS_EXAMPLE)
        for topic, parts in per.items():
            for p, ts in parts.items():
                if ts < 0:
                    raise StrataOptionError(f"Option '{name_by_ts}': timestamp {ts} for {topic}-{p} "
                                            "is negative")
        return OffsetSpec("timestamps", per_partition=per)
    raw = opts.get(name_offsets.lower())
    default = "latest" if (role == "ending" or streaming) else "earliest"
    if raw is None or raw.strip().lower() == default:
        return OffsetSpec(default)
    word = raw.strip().lower()
    if word in ("earliest", "latest"):
        if role == "starting" and word == "latest" and not streaming:
            raise StrataOptionError("Option 'startingOffsets': starting offset can't be latest "
                                    "for batch queries on strata")
        if role == "ending" and word == "earliest":
            raise StrataOptionError("Option 'endingOffsets': ending offset can't be earliest for "
                                    "batch queries on strata")
        return OffsetSpec(word)
    per = parse_partition_map(raw, name_offsets, _OFFSETS_EXAMPLE)
    for topic, parts in per.items():
        for p, off in parts.items():
            if off < EARLIEST:
                raise StrataOptionError(f"Option '{name_offsets}': offset {off} for {topic}-{p} "
                                        "is not an offset, -2 (earliest) or -1 (latest)")
            if role == "starting" and off == LATEST and not streaming:
                raise StrataOptionError(f"Option 'startingOffsets': starting offset for "
                                        f"{topic}-{p} can't be latest (-1) for batch queries")
            if role == "ending" and off == EARLIEST:
                raise StrataOptionError(f"Option 'endingOffsets': ending offset for {topic}-{p} "
                                        "can't be earliest (-2) for batch queries")
    return OffsetSpec("offsets", per_partition=per)


# ---- the parsers --------------------------------------------------------------------------------

def parse_source_options(options: Mapping[str, Any], *, streaming: bool) -> SourceOptions:
    """Check and parse the options of a batch (``streaming=False``) or streaming read."""
    opts = _lower(options)
    servers = bootstrap_servers(opts)

    given = [k for k in STRATEGY_OPTIONS if k in opts]
    if not given:
        raise StrataOptionError("One of the following options must be specified for the strata "
                                "source: subscribe, subscribePattern, assign")
    if len(given) > 1:
        raise StrataOptionError("Only one of the following options can be specified for the "
                                "strata source: subscribe, subscribePattern, assign")
    subscribe: tuple[str, ...] = ()
    pattern: str | None = None
    assign: dict[str, tuple[int, ...]] | None = None
    if "subscribe" in opts:
        subscribe = tuple(dict.fromkeys(t.strip() for t in opts["subscribe"].split(",")
                                        if t.strip()))
        if not subscribe:
            raise StrataOptionError("No topics to subscribe to as specified value for option "
                                    f"'subscribe' is '{opts['subscribe']}'")
    elif "subscribepattern" in opts:
        pattern = opts["subscribepattern"].strip()
        if not pattern:
            raise StrataOptionError("Pattern to subscribe is empty as specified value for option "
                                    f"'subscribePattern' is '{opts['subscribepattern']}'")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise StrataOptionError(f"Option 'subscribePattern': invalid regex {pattern!r}: "
                                    f"{exc}") from None
    else:
        assign = parse_assign(opts["assign"])

    if streaming:
        for key, name in (("endingoffsets", "endingOffsets"), ("endingtimestamp", "endingTimestamp"),
                          ("endingoffsetsbytimestamp", "endingOffsetsByTimestamp")):
            if key in opts:
                raise StrataOptionError(f"Option '{name}' is not valid in streaming queries")

    strategy = opts.get("startingoffsetsbytimestampstrategy", "error").strip().lower()
    if strategy not in ("error", "latest"):
        raise StrataOptionError("Option 'startingOffsetsByTimestampStrategy' must be 'error' or "
                                f"'latest', got '{opts['startingoffsetsbytimestampstrategy']}'")

    from strata.spark.remote_segments import rsm_props_from_options
    rsm_props = rsm_props_from_options(opts)
    mode = opts.get("mode", "direct" if rsm_props is not None else "broker").strip().lower()
    if mode not in MODES:
        raise StrataOptionError(f"Option 'mode' must be 'direct' or 'broker', got '{opts['mode']}'")
    if mode == "direct" and rsm_props is None:
        raise StrataOptionError("Option 'mode' is 'direct' but no remote tier is configured: set "
                                "the rsm.config.* options (e.g. rsm.config.storage.url), "
                                "remote.log.storage.manager.class.name, or "
                                "strata.server.properties=<the broker's server.properties>")

    timeout_ms = _positive_int(opts, "kafkaconsumer.polltimeoutms", "kafkaConsumer.pollTimeoutMs",
                               DEFAULT_TIMEOUT_MS)
    return SourceOptions(
        bootstrap_servers=servers, streaming=streaming, subscribe=subscribe,
        subscribe_pattern=pattern, assign=assign,
        starting=_offsets_spec(opts, "starting", streaming),
        ending=OffsetSpec("latest") if streaming else _offsets_spec(opts, "ending", streaming),
        start_timestamp_strategy=strategy,
        fail_on_data_loss=_bool(opts, "failondataloss", "failOnDataLoss", True),
        include_headers=_bool(opts, "includeheaders", "includeHeaders", False),
        max_offsets_per_trigger=_positive_int(opts, "maxoffsetspertrigger", "maxOffsetsPerTrigger",
                                              None),
        min_partitions=_positive_int(opts, "minpartitions", "minPartitions", None),
        max_records_per_partition=_positive_int(
            opts, "maxrecordsperpartition", "maxRecordsPerPartition",
            DEFAULT_MAX_RECORDS_PER_PARTITION) or DEFAULT_MAX_RECORDS_PER_PARTITION,
        max_bytes_per_partition=_positive_int(
            opts, "maxbytesperpartition", "maxBytesPerPartition",
            DEFAULT_MAX_BYTES_PER_PARTITION) or DEFAULT_MAX_BYTES_PER_PARTITION,
        fetch_max_bytes=_positive_int(opts, "fetch.max.bytes", "fetch.max.bytes",
                                      DEFAULT_FETCH_MAX_BYTES) or DEFAULT_FETCH_MAX_BYTES,
        timeout_s=(timeout_ms or DEFAULT_TIMEOUT_MS) / 1000,
        check_crc=_bool(opts, "checkcrc", "checkCrc", True),
        mode=mode, rsm_props=rsm_props)


# Producer settings the sink fixes: the issue asks for an idempotent producer that waits for
# every in-sync replica.
_FIXED_PRODUCER_CONFIG = {"enable.idempotence": "true", "acks": "all"}


def parse_sink_options(options: Mapping[str, Any]) -> SinkOptions:
    """Check and parse the options of a write (batch or streaming)."""
    opts = _lower(options)
    servers = bootstrap_servers(opts)
    topic = opts.get("topic")
    if topic is not None and not topic.strip():
        raise StrataOptionError("Option 'topic' is empty")
    producer = {k[len("kafka."):]: v for k, v in opts.items()
                if k.startswith("kafka.") and k != "kafka.bootstrap.servers"}
    for key, value in _FIXED_PRODUCER_CONFIG.items():
        if producer.get(key, value).lower() not in (value, "-1" if key == "acks" else value):
            raise StrataOptionError(f"Option 'kafka.{key}' is fixed to {value} by the strata "
                                    f"sink, got '{producer[key]}'")
        producer[key] = value
    producer["bootstrap.servers"] = servers
    return SinkOptions(bootstrap_servers=servers, topic=topic.strip() if topic else None,
                       producer_config=producer)
