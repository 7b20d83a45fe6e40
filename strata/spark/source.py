"""The ``strata`` PySpark data source: batch and streaming reads of both tiers, and the sink.

``register(spark)`` (in ``strata.spark``) makes it available as ``format("strata")``; the
options are documented in ``strata.spark.options``. The rows have the schema of Spark's Kafka
source (``key, value, topic, partition, offset, timestamp, timestampType[, headers]``).

Who runs what:

- the driver's planner worker calls ``reader()`` / ``partitions()`` (batch) or, in the
  long-lived streaming runner, ``initialOffset()`` / ``latestOffset()`` / ``partitions()`` /
  ``commit()``: metadata (Metadata, ListOffsets, the ``__remote_log_metadata`` records) through
  one ``BrokerClient``, planning in ``strata.spark.plan``;
- executors call ``read(partition)``: an input partition is a run of pieces of one
  topic-partition -- remote segments read straight from the object store through Strata's own
  RemoteStorageManager (``RemoteSegmentReader``: chunk cache, CRC checks, decryption, the next
  segment loading while one is decoded), and ranges through the broker's Fetch API (the local
  tail); bytes become Arrow record batches in ``batches_to_arrow``. Clients and segment
  readers are kept per Python worker process and reused by the tasks it runs; they are never
  pickled.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Iterator, Mapping

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource, DataSourceReader, DataSourceStreamReader, InputPartition)
from pyspark.sql.types import StructType

from strata.spark.arrow_records import (
    SPARK_SCHEMA_DDL, SPARK_SCHEMA_DDL_WITH_HEADERS, batches_to_arrow)
from strata.spark.options import (
    EARLIEST, LATEST, SourceOptions, StrataOptionError, parse_source_options)
from strata.spark.plan import (
    OffsetRange, ReadPiece, ReadTask, TopicPartitionKey, clamp_to_log_start, offset_ranges,
    offsets_from_json, offsets_to_json, plan_tasks, rate_limit, resolve_offsets,
    resolve_partitions)
from strata.spark.worker_env import prepare_worker

__all__ = ["StrataDataSource", "StrataPartition", "plan_read", "read_task"]

log = logging.getLogger("strata.spark")


class StrataPartition(InputPartition):
    """A Spark input partition carrying one ``ReadTask``."""

    def __init__(self, task: ReadTask) -> None:
        super().__init__(task)
        self.task = task

    def __repr__(self) -> str:
        return f"StrataPartition({self.task.describe()})"


# ---- per-process clients (executors and the driver's workers) --------------------------------------

_lock = threading.Lock()
_clients: dict[tuple[str, float], Any] = {}
_readers: dict[tuple[tuple[str, str], ...], Any] = {}


def _client(opts: SourceOptions):
    """This process's BrokerClient for ``opts``' brokers (connections are reused by tasks)."""
    from strata.spark.broker_client import BrokerClient
    key = (opts.bootstrap_servers, opts.timeout_s)
    with _lock:
        client = _clients.get(key)
        if client is None:
            client = _clients[key] = BrokerClient(opts.bootstrap_servers, timeout_s=opts.timeout_s)
        return client


def _drop_client(opts: SourceOptions) -> None:
    with _lock:
        client = _clients.pop((opts.bootstrap_servers, opts.timeout_s), None)
    if client is not None:
        client.close()


def _segment_reader(rsm_props: Mapping[str, str]):
    """This process's RemoteSegmentReader for ``rsm_props`` (its caches outlive a task)."""
    from strata.spark.remote_segments import RemoteSegmentReader
    key = tuple(sorted(rsm_props.items()))
    with _lock:
        reader = _readers.get(key)
        if reader is None:
            reader = _readers[key] = RemoteSegmentReader(dict(rsm_props))
        return reader


# ---- planning -------------------------------------------------------------------------------------

def _plan(opts: SourceOptions, client: Any, ranges: list[OffsetRange]) -> list[ReadTask]:
    """Input partitions for ``ranges`` in ``opts.mode``."""
    if not ranges:
        return []
    if opts.mode == "broker":
        return plan_tasks(ranges, max_bytes_per_partition=opts.max_bytes_per_partition,
                          max_records_per_partition=opts.max_records_per_partition,
                          min_partitions=opts.min_partitions)
    from strata.spark.remote_segments import remote_segments
    segments: dict[TopicPartitionKey, list] = {}
    for topic in sorted({r.topic for r in ranges}):
        for p, metas in remote_segments(client, topic).items():
            segments[(topic, p)] = list(metas)
    assert opts.rsm_props is not None
    tasks = plan_tasks(ranges, segments=segments,
                       positions=lambda meta: _segment_reader(opts.rsm_props).offset_positions(meta),
                       max_bytes_per_partition=opts.max_bytes_per_partition,
                       max_records_per_partition=opts.max_records_per_partition,
                       min_partitions=opts.min_partitions)
    pieces = [p for t in tasks for p in t.parts()]
    remote = sum(p.segment is not None for p in pieces)
    log.info("strata read: %d input partitions of %d pieces (%d from remote segments, %d "
             "through Fetch)", len(tasks), len(pieces), remote, len(pieces) - remote)
    return tasks


def plan_read(options: Mapping[str, str]) -> list[ReadTask]:
    """The input partitions a batch read with these options would run, in order (what
    ``spark.read.format("strata").options(**options).load()`` plans)."""
    opts = parse_source_options(options, streaming=False)
    from strata.spark.broker_client import BrokerClient
    with BrokerClient(opts.bootstrap_servers, timeout_s=opts.timeout_s) as client:
        return _plan(opts, client, offset_ranges(opts, client))


# ---- reading --------------------------------------------------------------------------------------

def read_task(task: ReadTask, opts: SourceOptions) -> Iterator[pa.RecordBatch]:
    """The rows of one input partition as Arrow record batches, piece after piece. Data loss
    (a missing remote object, offsets gone from the broker) fails the task, naming the segment
    or offsets, unless failOnDataLoss is false: then the missing part is skipped with a
    warning and the task goes on with what follows it."""
    prepare_worker()
    pieces = task.parts()
    for i, piece in enumerate(pieces):
        if piece.segment is not None:
            after = next((p for p in pieces[i + 1:] if p.segment is not None), None)
            if after is not None and \
                    after.segment.remote_log_segment_id != piece.segment.remote_log_segment_id:
                # the next segment's index and first chunks load while this one is read
                _segment_reader(opts.rsm_props or {}).prefetch(after.segment, after.start)
        yield from _read_piece(task, piece, opts)


def _read_piece(task: ReadTask, piece: ReadPiece, opts: SourceOptions) -> Iterator[pa.RecordBatch]:
    from strata.spark.broker_client import DataLossError
    start, end = piece.start, piece.end
    while start < end:
        try:
            check_crc = opts.check_crc
            if piece.segment is not None:
                reader = _segment_reader(opts.rsm_props or {})
                check_crc = check_crc and not reader.batches_verified(piece.segment)
                # views of one reused buffer: each is decoded before the next is read
                chunks = reader.views(piece.segment, start, end)
            else:
                chunks = _client(opts).read_range(task.topic, task.partition, start, end,
                                                  max_bytes=opts.fetch_max_bytes)
            for chunk in chunks:
                for batch in batches_to_arrow(chunk, task.topic, task.partition, start, end,
                                              include_headers=opts.include_headers,
                                              check_crc=check_crc):
                    if batch.num_rows:
                        start = batch.column("offset")[-1].as_py() + 1
                        yield batch
            return
        except DataLossError as exc:
            if opts.fail_on_data_loss:
                raise
            # the error names the lost offsets [exc.start, exc.end): carry on after them
            resume = getattr(exc, "end", None)
            if piece.segment is None and isinstance(resume, int) and start < resume < end:
                log.warning("%s: skipping lost offsets [%d, %d): %s (failOnDataLoss=false)",
                            task.describe(piece), start, resume, exc)
                start = resume
                continue
            log.warning("%s: skipping offsets [%d, %d): %s (failOnDataLoss=false)",
                        task.describe(piece), start, end, exc)
            return
        except OSError:
            if piece.segment is None:
                _drop_client(opts)   # a broken connection must not be reused by the next task
            raise


class _ClientHolder:
    """A lazily opened BrokerClient owned by one reader object, left out of its pickle."""

    _client: Any = None
    opts: SourceOptions

    def client(self):
        if self._client is None:
            from strata.spark.broker_client import BrokerClient
            self._client = BrokerClient(self.opts.bootstrap_servers, timeout_s=self.opts.timeout_s)
        return self._client

    def close_client(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_client", None)
        return state


class StrataBatchReader(_ClientHolder, DataSourceReader):
    """``spark.read.format("strata")``: ranges fixed at planning time."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.opts = parse_source_options(options, streaming=False)

    def partitions(self) -> list[InputPartition]:
        try:
            return [StrataPartition(t) for t in _plan(self.opts, self.client(),
                                                      offset_ranges(self.opts, self.client()))]
        finally:
            self.close_client()

    def read(self, partition: InputPartition | None) -> Iterator[pa.RecordBatch]:
        if partition is None:      # Spark's stand-in when there is nothing to read
            return iter(())
        return read_task(partition.task, self.opts)


class StrataStreamReader(_ClientHolder, DataSourceStreamReader):
    """``spark.readStream.format("strata")``. Offsets are ``{"topic": {"partition": offset}}``
    (the next offset to read, per partition). A micro-batch reads ``[start, end)`` of each
    partition, planned like a batch read; partitions that appear later start at their earliest
    offset. ``maxOffsetsPerTrigger`` caps a batch, counted from the end of the last batch this
    reader planned or was told about (Spark reports it on restart). Under
    ``Trigger.AvailableNow`` Spark asks for the latest offset once, so the cap then bounds the
    whole run: leave it unset there."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.opts = parse_source_options(options, streaming=True)
        self._initial: dict[TopicPartitionKey, int] | None = None
        self._last_end: dict[TopicPartitionKey, int] | None = None

    def _partitions(self) -> dict[str, list[int]]:
        return resolve_partitions(self.opts, self.client())

    def _initial_offsets(self) -> dict[TopicPartitionKey, int]:
        """startingOffsets resolved once per query run: Spark may ask for the latest offset
        before the initial one, and both must come from the same resolution."""
        if self._initial is None:
            self._initial = resolve_offsets(
                self.opts.starting, self._partitions(), self.client(), starting=True,
                start_timestamp_strategy=self.opts.start_timestamp_strategy)
        return self._initial

    def initialOffset(self) -> dict:
        return offsets_to_json(self._initial_offsets())

    def latestOffset(self) -> dict:
        client = self.client()
        if self._last_end is None:
            # a new query (a restarted one was told its last offsets through partitions()):
            # it starts at the initial offsets
            self._last_end = dict(self._initial_offsets())
        latest: dict[TopicPartitionKey, int] = {}
        for topic, parts in self._partitions().items():
            if parts:
                latest.update({(topic, p): o
                               for p, o in client.list_offsets(topic, parts, LATEST).items()})
        limit = self.opts.max_offsets_per_trigger
        if limit is not None:
            base = dict(self._last_end)
            for topic in {t for t, p in latest if (t, p) not in base}:
                new = [p for t, p in latest if t == topic and (t, p) not in base]
                base.update({(topic, p): o for p, o in
                             client.list_offsets(topic, new, EARLIEST).items()})
            latest = rate_limit(base, latest, limit)
        self._last_end = dict(latest)
        return offsets_to_json(latest)

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        begin, finish = offsets_from_json(start), offsets_from_json(end)
        self._last_end = dict(finish)
        opts, client = self.opts, self.client()
        for tp in sorted(set(begin) - set(finish)):
            self._data_loss(f"{tp[0]}-{tp[1]} is gone (it was at offset {begin[tp]})")
        ranges: list[OffsetRange] = []
        by_topic: dict[str, list[int]] = {}
        for topic, p in finish:
            by_topic.setdefault(topic, []).append(p)
        for topic, parts in sorted(by_topic.items()):
            if all(begin.get((topic, p)) == finish[(topic, p)] for p in parts):
                continue
            log_start = client.list_offsets(topic, sorted(parts), EARLIEST)
            for p in sorted(parts):
                e = finish[(topic, p)]
                s = begin.get((topic, p), log_start[p])   # a new partition: from its start
                s = clamp_to_log_start(topic, p, s, log_start[p], opts.fail_on_data_loss)
                if e < s:
                    self._data_loss(f"{topic}-{p} went back from offset {s} to {e} (was the "
                                    "topic deleted and recreated?)")
                elif s < e:
                    ranges.append(OffsetRange(topic, p, s, e))
        return [StrataPartition(t) for t in _plan(opts, client, ranges)]

    def _data_loss(self, message: str) -> None:
        if self.opts.fail_on_data_loss:
            from strata.spark.broker_client import DataLossError
            raise DataLossError(message + "; set failOnDataLoss=false to carry on")
        log.warning("%s (failOnDataLoss=false)", message)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_task(partition.task, self.opts)

    def commit(self, end: dict) -> None:
        """Nothing to clean up: the source keeps no state outside Spark's checkpoint."""

    def stop(self) -> None:
        self.close_client()


class StrataDataSource(DataSource):
    """The ``strata`` format (see the module docstring and ``strata.spark.options``)."""

    @classmethod
    def name(cls) -> str:
        return "strata"

    def _include_headers(self) -> bool:
        value = str(self.options.get("includeHeaders", self.options.get("includeheaders", "false")))
        if value.strip().lower() not in ("true", "false"):
            raise StrataOptionError(f"Option 'includeHeaders' must be true or false, got '{value}'")
        return value.strip().lower() == "true"

    def schema(self) -> str:
        prepare_worker()
        return SPARK_SCHEMA_DDL_WITH_HEADERS if self._include_headers() else SPARK_SCHEMA_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        prepare_worker()
        return StrataBatchReader(self.options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        prepare_worker()
        return StrataStreamReader(self.options)

    def writer(self, schema: StructType, overwrite: bool):
        prepare_worker()
        from strata.spark.sink import StrataBatchWriter
        return StrataBatchWriter(self.options, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool):
        prepare_worker()
        from strata.spark.sink import StrataStreamWriter
        return StrataStreamWriter(self.options, schema)
