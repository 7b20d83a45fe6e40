"""KIP-405 plugin interfaces and the value types they exchange.

Named as Apache Kafka names them in ``org.apache.kafka.server.log.remote.storage``
(Kafka 4.3), with snake_case methods. Plugins (RemoteStorageManager and
RemoteLogMetadataManager implementations) depend on this module alone; it imports only
``strata.common`` and the standard library.

Value types are immutable and compare by value, as Kafka's ``equals`` does. Constructors
validate what Kafka's constructors validate, and raise ``ValueError`` where Kafka throws
``IllegalArgumentException``.

Threading: RemoteStorageManager calls are synchronous and blocking, as Kafka's are; the
broker runs them on the remote log manager's thread pools. RemoteLogMetadataManager
publishing calls return a ``concurrent.futures.Future`` (Kafka's ``CompletableFuture``);
the event loop awaits one with ``asyncio.wrap_future``.
"""

from __future__ import annotations

import abc
import base64
import concurrent.futures
import dataclasses
import enum
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from pathlib import Path
from types import MappingProxyType
from typing import Any, BinaryIO, Protocol

from strata.common.types import TopicIdPartition, TopicPartition

__all__ = [
    "CustomMetadata",
    "IndexType",
    "LogSegmentData",
    "RemoteLogMetadata",
    "RemoteLogMetadataManager",
    "RemoteLogSegmentId",
    "RemoteLogSegmentMetadata",
    "RemoteLogSegmentMetadataUpdate",
    "RemoteLogSegmentState",
    "RemotePartitionDeleteMetadata",
    "RemotePartitionDeleteState",
    "FencedLeaderEpochException",
    "RemoteResourceNotFoundException",
    "RemoteStorageException",
    "RemoteStorageManager",
    "RemoteStorageNotReadyException",
    "RetriableRemoteStorageException",
    "TopicIdPartition",
    "TopicPartition",
]


# --------------------------------------------------------------------------- exceptions


class RemoteStorageException(Exception):
    """A remote storage or remote metadata operation failed.

    Base class for the errors a RemoteStorageManager or RemoteLogMetadataManager raises.
    """

    retriable: bool = False


class RemoteResourceNotFoundException(RemoteStorageException):
    """A resource (a segment, one of its indexes, ...) is not in remote storage."""


class FencedLeaderEpochException(RemoteStorageException):
    """A remote log metadata event refused because a later leader of its partition wrote
    first: the writer's ``leader_epoch`` is below one the metadata has already applied."""


class RetriableRemoteStorageException(RemoteStorageException):
    """The operation failed but may succeed if retried later."""

    retriable = True


class RemoteStorageNotReadyException(RetriableRemoteStorageException):
    """Remote storage or its metadata layer is not ready yet (initialising, unreachable,
    temporarily unavailable); retry later."""


# --------------------------------------------------------------------------- states


class _LifeCycle(enum.IntEnum):
    """A state enum whose value is the id stored in metadata records; subclasses list their
    transitions in ``_transitions()`` (a state may also move to itself: retries and fail-over
    republish the same state) and their first state in ``_initial()``."""

    @property
    def id(self) -> int:
        return int(self)

    @classmethod
    def for_id(cls, state_id: int):
        """The state with this id, or None (Kafka's ``forId`` returns null)."""
        try:
            return cls(state_id)
        except ValueError:
            return None

    @classmethod
    def is_valid_transition(cls, src, dst) -> bool:
        """Kafka's ``isValidTransition``; ``src is None`` means the state is not known yet, so
        only the initial state may begin a life cycle."""
        if dst is None:
            raise ValueError("target state can not be None")
        if src is None:
            return dst is cls._initial()
        return src == dst or dst in cls._transitions()[cls(src)]


class RemoteLogSegmentState(_LifeCycle):
    """Life cycle of a remote log segment.

    COPY_SEGMENT_STARTED -> COPY_SEGMENT_FINISHED or DELETE_SEGMENT_STARTED;
    COPY_SEGMENT_FINISHED -> DELETE_SEGMENT_STARTED; DELETE_SEGMENT_STARTED ->
    DELETE_SEGMENT_FINISHED.
    """

    COPY_SEGMENT_STARTED = 0
    COPY_SEGMENT_FINISHED = 1
    DELETE_SEGMENT_STARTED = 2
    DELETE_SEGMENT_FINISHED = 3

    @classmethod
    def _initial(cls):
        return cls.COPY_SEGMENT_STARTED

    @classmethod
    def _transitions(cls):
        return _SEGMENT_TRANSITIONS


class RemotePartitionDeleteState(_LifeCycle):
    """Deletion life cycle of a partition's remote data:
    DELETE_PARTITION_MARKED -> DELETE_PARTITION_STARTED -> DELETE_PARTITION_FINISHED."""

    DELETE_PARTITION_MARKED = 0
    DELETE_PARTITION_STARTED = 1
    DELETE_PARTITION_FINISHED = 2

    @classmethod
    def _initial(cls):
        return cls.DELETE_PARTITION_MARKED

    @classmethod
    def _transitions(cls):
        return _PARTITION_DELETE_TRANSITIONS


_S = RemoteLogSegmentState
_SEGMENT_TRANSITIONS = {
    _S.COPY_SEGMENT_STARTED: frozenset({_S.COPY_SEGMENT_FINISHED, _S.DELETE_SEGMENT_STARTED}),
    _S.COPY_SEGMENT_FINISHED: frozenset({_S.DELETE_SEGMENT_STARTED}),
    _S.DELETE_SEGMENT_STARTED: frozenset({_S.DELETE_SEGMENT_FINISHED}),
    _S.DELETE_SEGMENT_FINISHED: frozenset(),
}
_P = RemotePartitionDeleteState
_PARTITION_DELETE_TRANSITIONS = {
    _P.DELETE_PARTITION_MARKED: frozenset({_P.DELETE_PARTITION_STARTED}),
    _P.DELETE_PARTITION_STARTED: frozenset({_P.DELETE_PARTITION_FINISHED}),
    _P.DELETE_PARTITION_FINISHED: frozenset(),
}


class IndexType(enum.Enum):
    """Kinds of per-segment index a RemoteStorageManager stores (Kafka's ``RemoteStorageManager.IndexType``)."""

    OFFSET = 0
    TIMESTAMP = 1
    PRODUCER_SNAPSHOT = 2
    TRANSACTION = 3
    LEADER_EPOCH = 4


# --------------------------------------------------------------------------- value types


class CustomMetadata(bytes):
    """Opaque bytes a RemoteStorageManager returns from a copy, stored with the segment's
    metadata and never interpreted by the broker (Kafka's ``RemoteLogSegmentMetadata.CustomMetadata``).

    It is ``bytes`` and compares equal to the same bytes. The broker caps its size with
    ``remote.log.metadata.custom.metadata.max.bytes``.
    """

    __slots__ = ()

    @property
    def value(self) -> bytes:
        return bytes(self)

    def __repr__(self) -> str:
        return f"CustomMetadata({len(self)} bytes)"


def _custom_metadata(value: Any) -> CustomMetadata | None:
    if value is None or isinstance(value, CustomMetadata):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return CustomMetadata(value)
    raise TypeError(f"custom_metadata must be bytes or None, not {type(value).__name__}")


def _random_uuid() -> uuid.UUID:
    # Kafka's Uuid.randomUuid(): never the zero uuid, the metadata topic id (0...01) or one
    # whose base64 form starts with '-' (awkward on command lines and in file names).
    while True:
        u = uuid.uuid4()
        if u.int > 1 and not base64.urlsafe_b64encode(u.bytes).startswith(b"-"):
            return u


class RemoteLogMetadata:
    """Base of the records a RemoteLogMetadataManager stores.

    Every subclass has ``broker_id`` (the broker that generated the event),
    ``event_timestamp_ms`` (when), ``topic_id_partition`` and ``leader_epoch``: the leader
    epoch of the user partition that the writer led at when it wrote the event, or -1 where
    no leader wrote it (the controller, the partition remover) or the writer did not say
    (Kafka). Readers refuse an event whose epoch is below one already seen for its partition
    (a deposed leader's), so the field takes no part in equality.
    """

    __slots__ = ()


@dataclasses.dataclass(frozen=True, slots=True)
class RemoteLogSegmentId:
    """Universally unique id of one copy attempt of a partition's log segment.

    A new id is generated for every copy attempt, even a retry of the same segment.
    """

    topic_id_partition: TopicIdPartition
    id: uuid.UUID

    def __post_init__(self) -> None:
        if self.topic_id_partition is None:
            raise ValueError("topic_id_partition can not be None")
        if not isinstance(self.id, uuid.UUID):
            raise ValueError(f"id must be a uuid.UUID, not {type(self.id).__name__}")

    @classmethod
    def generate_new(cls, topic_id_partition: TopicIdPartition) -> RemoteLogSegmentId:
        """A new id with a random uuid for ``topic_id_partition``."""
        return cls(topic_id_partition, _random_uuid())


@dataclasses.dataclass(frozen=True, slots=True)
class RemoteLogSegmentMetadata(RemoteLogMetadata):
    """Metadata of one remote log segment, identified by its RemoteLogSegmentId.

    Invariants (Kafka's constructor): ``0 <= start_offset <= end_offset`` (both inclusive);
    ``segment_leader_epochs`` (leader epoch -> first offset of that epoch in the segment) is
    non-empty and kept sorted by epoch; if the whole segment has one epoch it maps that
    epoch to ``start_offset``. A new segment starts in COPY_SEGMENT_STARTED; later states come
    from ``create_with_updates``. ``txn_idx_empty`` tells readers the segment has no
    aborted-transaction index entries.
    """

    remote_log_segment_id: RemoteLogSegmentId
    start_offset: int
    end_offset: int
    max_timestamp_ms: int
    broker_id: int
    event_timestamp_ms: int
    segment_size_in_bytes: int
    _: dataclasses.KW_ONLY
    custom_metadata: CustomMetadata | None = None
    state: RemoteLogSegmentState = RemoteLogSegmentState.COPY_SEGMENT_STARTED
    segment_leader_epochs: Mapping[int, int]
    txn_idx_empty: bool = False
    leader_epoch: int = dataclasses.field(default=-1, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.remote_log_segment_id, RemoteLogSegmentId):
            raise ValueError("remote_log_segment_id must be a RemoteLogSegmentId")
        if self.state is None:
            raise ValueError("state can not be None")
        object.__setattr__(self, "state", RemoteLogSegmentState(self.state))
        if self.start_offset < 0:
            raise ValueError(f"Unexpected start offset = {self.start_offset}. "
                             "StartOffset for a remote segment cannot be negative")
        if self.end_offset < self.start_offset:
            raise ValueError(f"Unexpected end offset = {self.end_offset}. EndOffset for a remote "
                             f"segment cannot be less than startOffset = {self.start_offset}")
        object.__setattr__(self, "custom_metadata", _custom_metadata(self.custom_metadata))
        if not self.segment_leader_epochs:
            raise ValueError("segment_leader_epochs can not be None or empty")
        epochs = dict(sorted(self.segment_leader_epochs.items()))
        object.__setattr__(self, "segment_leader_epochs", MappingProxyType(epochs))
        object.__setattr__(self, "txn_idx_empty", bool(self.txn_idx_empty))

    def __hash__(self) -> int:
        return hash((self.remote_log_segment_id, self.start_offset, self.end_offset, self.broker_id,
                     self.max_timestamp_ms, self.event_timestamp_ms,
                     tuple(self.segment_leader_epochs.items()), self.segment_size_in_bytes,
                     self.custom_metadata, self.state, self.txn_idx_empty))

    def __reduce__(self) -> tuple[Any, ...]:
        # The read-only epoch mapping does not pickle; rebuild through the constructor.
        return (_rebuild_segment_metadata, (
            self.remote_log_segment_id, self.start_offset, self.end_offset, self.max_timestamp_ms,
            self.broker_id, self.event_timestamp_ms, self.segment_size_in_bytes, self.custom_metadata,
            self.state, dict(self.segment_leader_epochs), self.txn_idx_empty, self.leader_epoch))

    @property
    def topic_id_partition(self) -> TopicIdPartition:
        return self.remote_log_segment_id.topic_id_partition

    def create_with_updates(self, update: RemoteLogSegmentMetadataUpdate) -> RemoteLogSegmentMetadata:
        """A new instance with the update's state, custom metadata, broker id, event time and
        leader epoch.

        Offsets, size, epochs and ``txn_idx_empty`` are kept. The update must be for this
        segment; the state transition is not checked here (the metadata manager checks it).
        """
        if update.remote_log_segment_id != self.remote_log_segment_id:
            raise ValueError("Given update does not have this instance's remote_log_segment_id.")
        return dataclasses.replace(
            self, broker_id=update.broker_id, event_timestamp_ms=update.event_timestamp_ms,
            custom_metadata=update.custom_metadata, state=update.state,
            leader_epoch=update.leader_epoch)


def _rebuild_segment_metadata(segment_id, start_offset, end_offset, max_timestamp_ms, broker_id,
                              event_timestamp_ms, size, custom_metadata, state, epochs,
                              txn_idx_empty, leader_epoch=-1) -> RemoteLogSegmentMetadata:
    return RemoteLogSegmentMetadata(
        segment_id, start_offset, end_offset, max_timestamp_ms, broker_id, event_timestamp_ms, size,
        custom_metadata=custom_metadata, state=state, segment_leader_epochs=epochs,
        txn_idx_empty=txn_idx_empty, leader_epoch=leader_epoch)


@dataclasses.dataclass(frozen=True, slots=True)
class RemoteLogSegmentMetadataUpdate(RemoteLogMetadata):
    """A state change (and, on COPY_SEGMENT_FINISHED, the RSM's custom metadata) of a remote segment."""

    remote_log_segment_id: RemoteLogSegmentId
    event_timestamp_ms: int
    custom_metadata: CustomMetadata | None
    state: RemoteLogSegmentState
    broker_id: int
    _: dataclasses.KW_ONLY
    leader_epoch: int = dataclasses.field(default=-1, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.remote_log_segment_id, RemoteLogSegmentId):
            raise ValueError("remote_log_segment_id must be a RemoteLogSegmentId")
        if self.state is None:
            raise ValueError("state can not be None")
        object.__setattr__(self, "state", RemoteLogSegmentState(self.state))
        object.__setattr__(self, "custom_metadata", _custom_metadata(self.custom_metadata))

    @property
    def topic_id_partition(self) -> TopicIdPartition:
        return self.remote_log_segment_id.topic_id_partition


@dataclasses.dataclass(frozen=True, slots=True)
class RemotePartitionDeleteMetadata(RemoteLogMetadata):
    """A delete-state event for all remote data of a partition.

    The controller publishes DELETE_PARTITION_MARKED; the remote partition remover then
    publishes DELETE_PARTITION_STARTED, deletes every segment, and publishes
    DELETE_PARTITION_FINISHED.
    """

    topic_id_partition: TopicIdPartition
    state: RemotePartitionDeleteState
    event_timestamp_ms: int
    broker_id: int
    _: dataclasses.KW_ONLY
    leader_epoch: int = dataclasses.field(default=-1, compare=False)

    def __post_init__(self) -> None:
        if self.topic_id_partition is None:
            raise ValueError("topic_id_partition can not be None")
        if self.state is None:
            raise ValueError("state can not be None")
        object.__setattr__(self, "state", RemotePartitionDeleteState(self.state))


@dataclasses.dataclass(frozen=True, slots=True)
class LogSegmentData:
    """The files of one local segment handed to ``RemoteStorageManager.copy_log_segment_data``.

    ``transaction_index`` is None when the segment has no transaction index file;
    ``producer_snapshot_index`` is the producer state snapshot as of this segment's end;
    ``leader_epoch_index`` is the leader-epoch checkpoint content (checkpoint file format)
    as of this segment's end, truncated to it.
    """

    log_segment: Path
    offset_index: Path
    time_index: Path
    transaction_index: Path | None
    producer_snapshot_index: Path
    leader_epoch_index: bytes

    def __post_init__(self) -> None:
        for name in ("log_segment", "offset_index", "time_index", "producer_snapshot_index"):
            value = getattr(self, name)
            if value is None:
                raise ValueError(f"{name} can not be None")
            object.__setattr__(self, name, Path(value))
        if self.transaction_index is not None:
            object.__setattr__(self, "transaction_index", Path(self.transaction_index))
        if self.leader_epoch_index is None:
            raise ValueError("leader_epoch_index can not be None")
        object.__setattr__(self, "leader_epoch_index", bytes(self.leader_epoch_index))


# --------------------------------------------------------------------------- interfaces


class ChunkCacheStats(Protocol):
    """What the metrics endpoint reads of a remote storage manager's cache: ``stats()`` by
    name, of which the ``LEVEL_STATS`` names are gauges (the others counters)."""

    LEVEL_STATS: AbstractSet[str]

    def stats(self) -> Mapping[str, float]: ...


class RemoteStorageManager(abc.ABC):
    """Copies, fetches and deletes log segments and their indexes in remote storage.

    Every copy is keyed by a RemoteLogSegmentId that is unique even for the same segment
    and offsets, so retries never overwrite a segment readers may be using. The broker
    records each copy and delete in the RemoteLogMetadataManager before and after calling
    this interface; that record is the source of truth, so the store itself may be only
    eventually consistent for listings. Configured with the ``rsm.config.``-prefixed
    broker properties (prefix stripped). Calls are blocking and may come from several
    threads at once.
    """

    IndexType = IndexType

    @abc.abstractmethod
    def configure(self, configs: Mapping[str, Any]) -> None:
        """Take the plugin's configuration; called once, before any other method."""

    @abc.abstractmethod
    def copy_log_segment_data(self, remote_log_segment_metadata: RemoteLogSegmentMetadata,
                              log_segment_data: LogSegmentData) -> CustomMetadata | None:
        """Copy the segment and its indexes (offset, time, transaction if present, producer
        snapshot, leader epoch) to remote storage.

        Idempotent: a retry with the same metadata overwrites anything partially written
        and does not fail because content exists. Returns custom metadata to store with
        the segment, or None. Raises RemoteStorageException on failure.
        """

    @abc.abstractmethod
    def fetch_log_segment(self, remote_log_segment_metadata: RemoteLogSegmentMetadata,
                          start_position: int, end_position: int | None = None) -> BinaryIO:
        """A binary stream of the segment's bytes from ``start_position`` (inclusive) to
        ``end_position`` (inclusive) or, if it is None or past the end, to the end of the
        segment. The caller closes the stream.

        Raises RemoteResourceNotFoundException if the segment is not in remote storage,
        RemoteStorageException on other failures.
        """

    @abc.abstractmethod
    def fetch_index(self, remote_log_segment_metadata: RemoteLogSegmentMetadata,
                    index_type: IndexType) -> BinaryIO:
        """A binary stream of one of the segment's indexes. The caller closes the stream.

        A missing index (a transaction index that was never written, for one) raises
        RemoteResourceNotFoundException; this method never returns None.
        """

    def fetch_indexes(self, remote_log_segment_metadata: RemoteLogSegmentMetadata,
                      index_types: Iterable[IndexType]) -> dict[IndexType, BinaryIO]:
        """Several of the segment's indexes at once (Strata's, not Kafka's interface), for a
        plugin that can read them in fewer requests than one each. An index the segment does
        not have is left out of the result. This default calls ``fetch_index`` for each."""
        out: dict[IndexType, BinaryIO] = {}
        for index_type in index_types:
            try:
                out[index_type] = self.fetch_index(remote_log_segment_metadata, index_type)
            except RemoteResourceNotFoundException:
                continue
        return out

    @abc.abstractmethod
    def delete_log_segment_data(self, remote_log_segment_metadata: RemoteLogSegmentMetadata) -> None:
        """Delete the segment and all its indexes.

        Idempotent: resources already gone are not an error (no
        RemoteResourceNotFoundException). Returning normally means everything is deleted;
        any failure raises RemoteStorageException.
        """

    @property
    def prefetch_max_size(self) -> int:
        """The most read-ahead ``prefetch`` is worth asking for at once; 0: none (Strata's)."""
        return 0

    def prefetch(self, remote_log_segment_metadata: RemoteLogSegmentMetadata,
                 start_position: int, length: int) -> int:
        """A hint (Strata's, not Kafka's interface): a reader will soon read ``length`` bytes
        of the segment from ``start_position``; load them in the background. Never blocks
        on the store, never raises. A ``length`` of 0 warms only what any read of the segment
        needs first (Strata's RSM: its manifest). Returns how much of the range lies past the
        segment's end, for the caller to continue in the next segment. This default does
        nothing."""
        size = remote_log_segment_metadata.segment_size_in_bytes
        return max(0, start_position + length - size)

    def batches_verified(self, remote_log_segment_metadata: RemoteLogSegmentMetadata) -> bool:
        """Whether the record batches ``fetch_log_segment`` returns for the segment are known
        intact (Strata's, not Kafka's interface): each passed its CRC32C check when the
        segment was copied, and the plugin checks what it fetches against checksums taken
        then. A reader may then skip checking each batch's CRC32C itself. This default: False."""
        return False

    def abort_incomplete_uploads(self) -> int:
        """Remove what interrupted uploads left in the store (Strata's, not Kafka's
        interface): uploads older than the plugin's bound, never one in progress in this
        process. How many were removed. This default removes nothing."""
        return 0

    def abort_waits(self) -> None:
        """Uploads waiting in the plugin's rate limits fail now (Strata's, not Kafka's
        interface): the remote log manager's shutdown does not wait them out. This default
        has no such waits."""

    @property
    def chunk_cache(self) -> ChunkCacheStats | None:
        """The plugin's cache of remote data, which the metrics endpoint reports (Strata's,
        not Kafka's interface); this default has none."""
        return None

    @abc.abstractmethod
    def close(self) -> None:
        """Release resources; no other method is called afterwards."""

    def __enter__(self) -> RemoteStorageManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RemoteLogMetadataManager(abc.ABC):
    """Stores and serves remote log segment metadata with strongly consistent semantics.

    The default implementation keeps it in the ``__remote_log_metadata`` topic. Configured
    with ``cluster.id``, ``broker.id`` and the ``rlmm.config.``-prefixed broker properties
    (prefix stripped). Publishing methods return a future that completes once the event is
    stored and visible to this broker's reads (or fails with RemoteStorageException).
    Calls may come from several threads at once.
    """

    @abc.abstractmethod
    def configure(self, configs: Mapping[str, Any]) -> None:
        """Take the plugin's configuration; called once, before any other method."""

    @abc.abstractmethod
    def add_remote_log_segment_metadata(
            self, remote_log_segment_metadata: RemoteLogSegmentMetadata) -> concurrent.futures.Future[None]:
        """Publish a new segment's metadata, which must be in COPY_SEGMENT_STARTED
        (ValueError otherwise). Later changes go through ``update_remote_log_segment_metadata``.
        """

    @abc.abstractmethod
    def update_remote_log_segment_metadata(
            self, remote_log_segment_metadata_update: RemoteLogSegmentMetadataUpdate) -> concurrent.futures.Future[None]:
        """Publish a state change of a known segment, following
        ``RemoteLogSegmentState.is_valid_transition``.

        An update to COPY_SEGMENT_STARTED raises ValueError; an unknown segment raises
        (or fails the future with) RemoteResourceNotFoundException.
        """

    @abc.abstractmethod
    def remote_log_segment_metadata(self, topic_id_partition: TopicIdPartition, epoch_for_offset: int,
                                    offset: int) -> RemoteLogSegmentMetadata | None:
        """The segment that holds ``offset`` written in leader epoch ``epoch_for_offset``,
        or None. Must return only fully copied segments (COPY_SEGMENT_FINISHED), as Kafka's
        topic-based manager does: readers never see a partial copy."""

    @abc.abstractmethod
    def highest_offset_for_epoch(self, topic_id_partition: TopicIdPartition, leader_epoch: int) -> int | None:
        """The highest offset of ``leader_epoch`` already copied to remote storage, or None.

        The copier uses it to know where copying must resume.
        """

    @abc.abstractmethod
    def put_remote_partition_delete_metadata(
            self, remote_partition_delete_metadata: RemotePartitionDeleteMetadata) -> concurrent.futures.Future[None]:
        """Publish a partition delete state change, following
        ``RemotePartitionDeleteState.is_valid_transition``."""

    @abc.abstractmethod
    def list_remote_log_segments(self, topic_id_partition: TopicIdPartition,
                                 leader_epoch: int | None = None) -> Iterator[RemoteLogSegmentMetadata]:
        """All remote segment metadata of the partition or, with ``leader_epoch``, of the
        segments containing records of that epoch, sorted by start offset ascending.

        Kafka's topic-based manager lists COPY_SEGMENT_STARTED, COPY_SEGMENT_FINISHED and
        DELETE_SEGMENT_STARTED segments, so retention and the partition remover can clean
        up failed copies too."""

    @abc.abstractmethod
    def on_partition_leadership_changes(self, leader_partitions: AbstractSet[TopicIdPartition],
                                        follower_partitions: AbstractSet[TopicIdPartition]) -> None:
        """Partitions this broker now leads or follows; the manager starts serving their metadata."""

    @abc.abstractmethod
    def on_stop_partitions(self, partitions: AbstractSet[TopicIdPartition]) -> None:
        """Partitions no longer hosted here (moved away or deleted); their metadata may be dropped."""

    @abc.abstractmethod
    def remote_log_size(self, topic_id_partition: TopicIdPartition, leader_epoch: int) -> int:
        """Total bytes of the partition's remote segments that contain ``leader_epoch``."""

    def next_segment_with_txn_index(self, topic_id_partition: TopicIdPartition, epoch: int,
                                    offset: int) -> RemoteLogSegmentMetadata | None:
        """The next segment at or after ``offset`` in ``epoch`` that may hold aborted
        transactions. The default returns ``remote_log_segment_metadata(...)`` whether or
        not it has a transaction index; an implementation may skip segments whose
        ``txn_idx_empty`` is set. Callers handle both."""
        return self.remote_log_segment_metadata(topic_id_partition, epoch, offset)

    def is_ready(self, topic_id_partition: TopicIdPartition) -> bool:
        """Whether the partition's metadata is loaded and can be served (default: True)."""
        return True

    # Strata's, not Kafka's interface: what the remote log manager asks beyond it. The
    # defaults fit a manager whose metadata is at hand at once (nothing to load or wait for).

    num_partitions: int = 0   # partitions of the metadata topic, where there is one

    def start(self) -> None:
        """Begin loading the stored metadata, after ``configure``; this default has none."""

    def add_ready_listener(self, listener: Callable[[TopicIdPartition], None]) -> None:
        """Call ``listener(tip)`` when a partition's metadata becomes ready; this default
        never does (its partitions are ready at once)."""

    def wait_ready(self, topic_id_partition: TopicIdPartition, timeout_s: float) -> bool:
        """Wait at most ``timeout_s`` for the partition's metadata to be ready; whether it
        is. This default does not wait: False."""
        return False

    def read_offset(self, metadata_partition: int) -> int | None:
        """How far metadata partition ``metadata_partition`` has been read, None before its
        first read (the remote log manager resumes deletions once every one has been)."""
        return None

    def describe(self) -> Iterable[RemoteLogMetadata]:
        """Every record the manager holds, of every partition (the remote log manager finds
        deleted topics' partitions in it); this default: none."""
        return ()

    def metadata_partition(self, topic_id_partition: TopicIdPartition) -> int | None:
        """The metadata topic's partition holding ``topic_id_partition``'s records, whose
        leader removes its remote data; None without one (every broker removes)."""
        return None

    @abc.abstractmethod
    def close(self) -> None:
        """Release resources; no other method is called afterwards."""

    def __enter__(self) -> RemoteLogMetadataManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
