"""The ``strata`` sink: ``df.write.format("strata")`` and ``df.writeStream.format("strata")``.

Columns, as Spark's Kafka sink takes them: ``value`` (binary or string, required, may be
null), ``key`` (binary or string, optional), ``topic`` (string; required unless the ``topic``
option is set, which then wins), ``partition`` (int, optional: else the producer's
partitioner), ``headers`` (``array<struct<key:string,value:binary>>``, optional). A
``timestamp`` column (timestamp type), which Spark's Kafka sink ignores, sets the records'
CreateTime here, so rows read from a topic write back with their timestamps. Other columns are
ignored.

Each write task produces its rows with one idempotent ``confluent_kafka.Producer``
(``enable.idempotence=true``, ``acks=all``; other ``kafka.*`` options are passed through),
flushes it at the end, and fails if any record was not acknowledged. Kafka topics have no
transactions here, so a failed job's acknowledged records stay written (at-least-once, as with
Spark's Kafka sink); commit and abort only log.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSourceArrowWriter, DataSourceStreamWriter, WriterCommitMessage)
from pyspark.sql.types import (
    ArrayType, BinaryType, IntegerType, StringType, StructType, TimestampNTZType, TimestampType)

from strata.spark.options import SinkOptions, StrataOptionError, parse_sink_options
from strata.spark.worker_env import prepare_worker

__all__ = ["SinkColumns", "StrataBatchWriter", "StrataCommitMessage", "StrataStreamWriter",
           "check_sink_schema", "produce_arrow"]

log = logging.getLogger("strata.spark")

FLUSH_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class SinkColumns:
    """Which optional columns the written DataFrame has."""

    key: bool
    topic: bool
    partition: bool
    headers: bool
    timestamp: bool


@dataclass
class StrataCommitMessage(WriterCommitMessage):
    records: int


def _is_headers_type(dt: Any) -> bool:
    if not isinstance(dt, ArrayType) or not isinstance(dt.elementType, StructType):
        return False
    fields = {f.name: f.dataType for f in dt.elementType.fields}
    return (set(fields) == {"key", "value"} and isinstance(fields["key"], StringType)
            and isinstance(fields["value"], BinaryType))


def check_sink_schema(schema: StructType, topic_option: str | None) -> SinkColumns:
    """The columns the sink uses; errors name the column and the types it accepts."""
    types = {f.name.lower(): f.dataType for f in schema.fields}
    if "value" not in types:
        raise StrataOptionError("Required attribute 'value' not found")
    if not isinstance(types["value"], (StringType, BinaryType)):
        raise StrataOptionError(f"value attribute type must be a string or binary, got "
                                f"{types['value'].simpleString()}")
    if "key" in types and not isinstance(types["key"], (StringType, BinaryType)):
        raise StrataOptionError(f"key attribute type must be a string or binary, got "
                                f"{types['key'].simpleString()}")
    if "topic" in types and not isinstance(types["topic"], StringType):
        raise StrataOptionError(f"topic attribute type must be a string, got "
                                f"{types['topic'].simpleString()}")
    if topic_option is None and "topic" not in types:
        raise StrataOptionError("topic option required when no 'topic' attribute is present. "
                                "Use the topic option for setting a topic.")
    if "partition" in types and not isinstance(types["partition"], IntegerType):
        raise StrataOptionError(f"partition attribute type must be an int, got "
                                f"{types['partition'].simpleString()}")
    if "headers" in types and not _is_headers_type(types["headers"]):
        raise StrataOptionError("headers attribute type must be "
                                "array<struct<key:string,value:binary>>, got "
                                f"{types['headers'].simpleString()}")
    if "timestamp" in types and not isinstance(types["timestamp"], (TimestampType,
                                                                     TimestampNTZType)):
        raise StrataOptionError(f"timestamp attribute type must be a timestamp, got "
                                f"{types['timestamp'].simpleString()}")
    return SinkColumns(key="key" in types, topic="topic" in types and topic_option is None,
                       partition="partition" in types, headers="headers" in types,
                       timestamp="timestamp" in types)


def _column(batch: pa.RecordBatch, name: str) -> pa.Array:
    index = {n.lower(): i for i, n in enumerate(batch.schema.names)}[name]
    return batch.column(index)


def _binary_list(array: pa.Array) -> list[bytes | None]:
    """Python bytes (None for nulls) of a string or binary column, converted in C."""
    if pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
        array = array.cast(pa.binary() if pa.types.is_string(array.type) else pa.large_binary())
    return array.to_pylist()


def _millis_list(array: pa.Array) -> list[int | None]:
    """Epoch milliseconds of a timestamp column (any unit, with or without a zone)."""
    micros = pc.cast(array.cast(pa.timestamp("us", tz=array.type.tz)), pa.int64())
    return pc.floor(pc.divide(micros.cast(pa.float64()), 1000)).cast(pa.int64()).to_pylist()


def produce_arrow(batches: Iterator[pa.RecordBatch], sink: SinkOptions,
                  columns: SinkColumns) -> int:
    """Produce every row of ``batches``; the number of records acknowledged. Raises when a
    record is not acknowledged (the first errors named) or the final flush times out."""
    from confluent_kafka import KafkaException, Producer
    errors: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(f"{msg.topic()}-{msg.partition()}: {err}")

    producer = Producer(dict(sink.producer_config))
    produce, poll = producer.produce, producer.poll
    count = 0
    for batch in batches:
        n = batch.num_rows
        if n == 0:
            continue
        values = _binary_list(_column(batch, "value"))
        keys = _binary_list(_column(batch, "key")) if columns.key else [None] * n
        topics = _column(batch, "topic").to_pylist() if columns.topic else [sink.topic] * n
        parts = (_column(batch, "partition").to_pylist() if columns.partition else [None] * n)
        times = _millis_list(_column(batch, "timestamp")) if columns.timestamp else [None] * n
        if columns.headers:
            headers = [None if h is None else [(e["key"], e["value"]) for e in h]
                       for h in _column(batch, "headers").to_pylist()]
        else:
            headers = [None] * n
        for i in range(n):
            topic = topics[i]
            if topic is None:
                raise ValueError("null topic encountered while writing a row; set the topic "
                                 "option or fill the topic column")
            part = parts[i]
            while True:
                try:
                    produce(topic, value=values[i], key=keys[i],
                            partition=-1 if part is None else part,
                            timestamp=times[i] or 0, headers=headers[i],
                            on_delivery=on_delivery)
                    break
                except BufferError:       # the local queue is full: let deliveries drain
                    poll(0.05)
        count += n
        poll(0)
        if errors:
            break
    remaining = producer.flush(FLUSH_TIMEOUT_S)
    if errors:
        raise KafkaException(f"{len(errors)} record(s) were not written; first: "
                             + "; ".join(errors[:3]))
    if remaining:
        raise KafkaException(f"{remaining} record(s) still unacknowledged after "
                             f"{FLUSH_TIMEOUT_S:.0f} s")
    return count


class _Writer:
    sink: SinkOptions
    columns: SinkColumns

    def _setup(self, options: Mapping[str, str], schema: StructType) -> None:
        self.sink = parse_sink_options(options)
        self.columns = check_sink_schema(schema, self.sink.topic)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StrataCommitMessage:
        prepare_worker()
        return StrataCommitMessage(produce_arrow(iterator, self.sink, self.columns))


def _total(messages: list[Any]) -> int:
    return sum(m.records for m in messages if isinstance(m, StrataCommitMessage))


class StrataBatchWriter(_Writer, DataSourceArrowWriter):
    """``df.write.format("strata")`` (save mode append; overwrite is refused, as Kafka's sink
    refuses it)."""

    def __init__(self, options: Mapping[str, str], schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise StrataOptionError("Save mode overwrite is not allowed for strata: a topic is "
                                    "append-only; use mode('append')")
        self._setup(options, schema)

    def commit(self, messages: list[Any]) -> None:
        log.info("strata sink: wrote %d records", _total(messages))

    def abort(self, messages: list[Any]) -> None:
        log.warning("strata sink: write failed; %d records already acknowledged stay in the "
                    "topic", _total(messages))


class StrataStreamWriter(_Writer, DataSourceStreamWriter, DataSourceArrowWriter):
    """``df.writeStream.format("strata")``: each micro-batch's tasks produce and flush."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self._setup(options, schema)

    def commit(self, messages: list[Any], batchId: int) -> None:  # type: ignore[override]
        log.info("strata sink: micro-batch %d wrote %d records", batchId, _total(messages))

    def abort(self, messages: list[Any], batchId: int) -> None:  # type: ignore[override]
        log.warning("strata sink: micro-batch %d failed; %d records already acknowledged stay "
                    "in the topic", batchId, _total(messages))
