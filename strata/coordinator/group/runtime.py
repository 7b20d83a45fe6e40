"""What the group coordinator's parts share (a small Kafka ``CoordinatorRuntime``): the
``__consumer_offsets`` port, the clock, the timers, the background tasks, the append order of
offsets, and whether the coordinator still serves.

Everything here runs on the one asyncio event loop (``seq`` is also drawn by the loader's
replay in a worker thread: ``itertools.count`` is safe to share).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any, Awaitable, Iterable, Mapping, Protocol

from strata.common.clock import Clock
from strata.common.errors import ErrorCode, KafkaError
from strata.coordinator.group.config import GroupCoordinatorConfig
from strata.coordinator.group.timers import Timers
from strata.coordinator.offsets_records import partition_for

log = logging.getLogger(__name__)


class OffsetsLog(Protocol):
    """Storage of ``__consumer_offsets``, implemented by the broker
    (``strata.coordinator.offsets_log.ReplicaOffsetsLog``).

    ``append`` writes the (key, value) records — value ``None`` is a tombstone — as one batch
    to ``__consumer_offsets-<partition>`` and returns once it is durable enough to acknowledge;
    it raises (ideally a ``KafkaError`` carrying the log's error code) when it is not. With
    ``transactional=True`` (TxnOffsetCommit only; plain commits pass no keywords) the batch is
    a transactional one of ``producer_id``/``producer_epoch``.
    ``replay`` yields the partition's records from its start, oldest first (committed data
    only: records of aborted transactions left out).

    ``replay_batches`` (optional; the loader falls back to ``replay`` without it) yields the
    same span with its transaction structure, in log order: records (``is_marker`` False;
    ``key``, ``value``, ``producer_id``, ``transactional``), aborted and open transactions
    included, and markers (``is_marker`` True; ``producer_id``, ``commit``)."""

    async def append(self, partition: int, records: list[tuple[bytes, bytes | None]], *,
                     producer_id: int = -1, producer_epoch: int = -1,
                     transactional: bool = False) -> None: ...

    def replay(self, partition: int) -> Iterable[tuple[bytes, bytes | None]]: ...


class CoordinatorRuntime:
    """The shared plumbing of ``GroupCoordinator``'s managers; see the module docstring."""

    def __init__(self, offsets_log: OffsetsLog, config: GroupCoordinatorConfig, clock: Clock,
                 timers: Timers):
        self.log = offsets_log
        self.config = config
        self.clock = clock
        self.timers = timers
        self.active = True
        # the loop the coordinator was loaded on (set by load): other threads hop onto it
        self.loop: asyncio.AbstractEventLoop | None = None
        self.tasks: set[asyncio.Task] = set()
        # append order of offsets, so a late completion never overwrites a newer offset
        self.seq = itertools.count(1)

    def now(self) -> int:
        return self.clock.milliseconds()

    def partition_for(self, group_id: str) -> int:
        return partition_for(group_id, self.config.offsets_topic_num_partitions)

    def spawn(self, coro: Awaitable[Any], what: str) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)  # type: ignore[arg-type]
        self.tasks.add(task)

        def done(t: asyncio.Task) -> None:
            self.tasks.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.error("group coordinator task %s failed", what, exc_info=t.exception())
        task.add_done_callback(done)
        return task

    async def append(self, partition: int, records: list[tuple[bytes, bytes | None]],
                     **txn: Any) -> ErrorCode:
        """Append to ``__consumer_offsets-<partition>``; ``txn`` holds ``producer_id``,
        ``producer_epoch`` and ``transactional`` for a transactional batch (plain appends
        pass no keywords)."""
        try:
            await self.log.append(partition, records, **txn)
            return ErrorCode.NONE
        except KafkaError as e:
            log.warning("append to __consumer_offsets-%d failed: %s", partition, e)
            return ErrorCode(e.code)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - any storage failure becomes an error code
            log.exception("append to __consumer_offsets-%d failed", partition)
            return ErrorCode.UNKNOWN_SERVER_ERROR

    async def append_tombstones(self, by_partition: Mapping[int, list[tuple[bytes, bytes | None]]]
                                ) -> None:
        for partition, records in by_partition.items():
            error = await self.append(partition, records)
            if error != ErrorCode.NONE:
                log.warning("failed to append %d tombstones to __consumer_offsets-%d: %s",
                            len(records), partition, error.name)
