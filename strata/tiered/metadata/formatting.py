"""Text forms of ``__remote_log_metadata`` records, as Kafka's tools print them.

Kafka's ``RemoteLogMetadataSerde.RemoteLogMetadataFormatter`` (the console consumer's
``--formatter`` for this topic) prints one line per record::

    partition: 3, offset: 17, value: RemoteLogSegmentMetadata{remoteLogSegmentId=...}

where the value is the Java ``toString`` of the decoded record. ``format_metadata`` reproduces
those ``toString`` forms (Kafka 4.x, ``storage/api``):

- ``TopicIdPartition``: ``<topic id>:<topic>-<partition>``, the id in Kafka's base64 form;
- ``RemoteLogSegmentId{topicIdPartition=..., id=...}``;
- ``RemoteLogSegmentMetadata{remoteLogSegmentId=..., startOffset=..., endOffset=...,
  brokerId=..., maxTimestampMs=..., eventTimestampMs=..., segmentLeaderEpochs={0=0, 3=120},
  segmentSizeInBytes=..., customMetadata=Optional[CustomMetadata{12 bytes}], state=...,
  txnIdxEmpty=false}`` (``Optional.empty`` without custom metadata);
- ``RemoteLogSegmentMetadataUpdate{remoteLogSegmentId=..., customMetadata=..., state=...,
  eventTimestampMs=..., brokerId=...}``;
- ``RemotePartitionDeleteMetadata{topicPartition=..., state=..., eventTimestampMs=...,
  brokerId=...}``;
- ``RemoteLogSegmentMetadataSnapshot{segmentId=..., startOffset=..., endOffset=...,
  maxTimestampMs=..., segmentLeaderEpochs=..., segmentSizeInBytes=..., customMetadata=...,
  state=...}``.

The ``repr`` of the api types is left as it is; these functions are for tools and logs.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping

from strata.common.types import uuid_to_kafka_str
from strata.tiered.api import (
    CustomMetadata,
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemotePartitionDeleteMetadata,
    RemoteStorageException,
    TopicIdPartition,
)
from strata.tiered.metadata.cache import RemotePartitionMetadataStore
from strata.tiered.metadata.serde import RemoteLogSegmentMetadataSnapshot, deserialize

__all__ = ["format_metadata", "format_record", "format_topic_id_partition", "format_verdict"]


def _uuid(value: uuid.UUID) -> str:
    return uuid_to_kafka_str(value)


def _bool(value: bool) -> str:
    return "true" if value else "false"


def _epochs(epochs: Mapping[int, int]) -> str:
    """A Java ``TreeMap`` of leader epoch to start offset: ``{0=0, 3=120}``."""
    return "{" + ", ".join(f"{e}={o}" for e, o in sorted(epochs.items())) + "}"


def _custom(value: CustomMetadata | bytes | None) -> str:
    """Kafka keeps custom metadata as ``Optional<CustomMetadata>``."""
    return "Optional.empty" if value is None else f"Optional[CustomMetadata{{{len(value)} bytes}}]"


def format_topic_id_partition(tip: TopicIdPartition) -> str:
    return f"{_uuid(tip.topic_id)}:{tip.topic}-{tip.partition}"


def _segment_id(segment_id: RemoteLogSegmentId) -> str:
    return (f"RemoteLogSegmentId{{topicIdPartition="
            f"{format_topic_id_partition(segment_id.topic_id_partition)}, "
            f"id={_uuid(segment_id.id)}}}")


def format_metadata(metadata: object) -> str:
    """Kafka's ``toString`` of a decoded ``__remote_log_metadata`` record value."""
    m = metadata
    if isinstance(m, RemoteLogSegmentMetadata):
        return (f"RemoteLogSegmentMetadata{{remoteLogSegmentId={_segment_id(m.remote_log_segment_id)}, "
                f"startOffset={m.start_offset}, endOffset={m.end_offset}, brokerId={m.broker_id}, "
                f"maxTimestampMs={m.max_timestamp_ms}, eventTimestampMs={m.event_timestamp_ms}, "
                f"segmentLeaderEpochs={_epochs(m.segment_leader_epochs)}, "
                f"segmentSizeInBytes={m.segment_size_in_bytes}, "
                f"customMetadata={_custom(m.custom_metadata)}, state={m.state.name}, "
                f"txnIdxEmpty={_bool(m.txn_idx_empty)}}}")
    if isinstance(m, RemoteLogSegmentMetadataUpdate):
        return (f"RemoteLogSegmentMetadataUpdate{{remoteLogSegmentId="
                f"{_segment_id(m.remote_log_segment_id)}, customMetadata={_custom(m.custom_metadata)}, "
                f"state={m.state.name}, eventTimestampMs={m.event_timestamp_ms}, "
                f"brokerId={m.broker_id}}}")
    if isinstance(m, RemotePartitionDeleteMetadata):
        return (f"RemotePartitionDeleteMetadata{{topicPartition="
                f"{format_topic_id_partition(m.topic_id_partition)}, state={m.state.name}, "
                f"eventTimestampMs={m.event_timestamp_ms}, brokerId={m.broker_id}}}")
    if isinstance(m, RemoteLogSegmentMetadataSnapshot):
        return (f"RemoteLogSegmentMetadataSnapshot{{segmentId={_uuid(m.segment_id)}, "
                f"startOffset={m.start_offset}, endOffset={m.end_offset}, "
                f"maxTimestampMs={m.max_timestamp_ms}, "
                f"segmentLeaderEpochs={_epochs(m.segment_leader_epochs)}, "
                f"segmentSizeInBytes={m.segment_size_in_bytes}, "
                f"customMetadata={_custom(m.custom_metadata)}, state={m.state.name}}}")
    raise TypeError(f"not a remote log metadata record: {type(m).__name__}")


def format_record(partition: int, offset: int, value: bytes | None) -> str:
    """One line of Kafka's RemoteLogMetadataFormatter for a record of the metadata topic.

    Raises ``MetadataParseException`` (a ValueError) for a value that does not decode.
    """
    if value is None:
        raise ValueError("a __remote_log_metadata record has a null value")
    return f"partition: {partition}, offset: {offset}, value: {format_metadata(deserialize(value))}"


def format_verdict(store: RemotePartitionMetadataStore, value: bytes) -> str:
    """What follows a record's line in ``strata tiered metadata``: ``, leaderEpoch: N`` where
    its writer said which epoch it led at, and ``, refused: <why>`` where ``store`` (applying
    the topic's records in order, as every broker does) skips it; empty for neither."""
    metadata = deserialize(value)
    epoch = getattr(metadata, "leader_epoch", -1)
    out = f", leaderEpoch: {epoch}" if epoch >= 0 else ""
    if isinstance(metadata, RemoteLogSegmentMetadataSnapshot):
        return out + ", refused: a snapshot record has no place in the topic"
    try:
        store.handle(metadata)
    except (ValueError, RemoteStorageException) as exc:
        out += f", refused: {exc}"
    return out
