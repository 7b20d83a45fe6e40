"""Topic creation off the event loop: the creations of a CreateTopics run side by side on
worker threads (each may wait for ZooKeeper and for the view), and a Metadata request that
auto-creates a topic hands it to an ``AutoTopicCreator`` and answers at once, as Kafka's
AutoTopicCreationManager does."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import logging
import threading
import weakref
from typing import Any, Callable, TypeVar

from strata.cluster.metadata import invalid_topic_reason
from strata.common.errors import ErrorCode, KafkaError

log = logging.getLogger(__name__)
T = TypeVar("T")

# most of a creation's time is waiting for ZooKeeper and the view, not the CPU
WORKERS = 32
_executor: concurrent.futures.ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def executor() -> concurrent.futures.ThreadPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = concurrent.futures.ThreadPoolExecutor(
                WORKERS, thread_name_prefix="topic-creation")
        return _executor


def submit(fn: Callable[[], T]) -> concurrent.futures.Future[T]:
    """``fn`` on a creation thread, in a copy of the caller's context (its quotas)."""
    return executor().submit(contextvars.copy_context().run, fn)


async def run_all(fns: list[Callable[[], T]], timeout_s: float | None
                  ) -> list[concurrent.futures.Future[T]]:
    """Runs every ``fn`` side by side and waits until all are done or ``timeout_s`` has
    passed; the futures, in order (those not done go on running)."""
    futures = [submit(fn) for fn in fns]
    if futures and (timeout_s is None or timeout_s > 0):
        await asyncio.wait([asyncio.wrap_future(f) for f in futures], timeout=timeout_s)
    return futures


class AutoTopicCreator:
    """Creates the topics Metadata requests name, one creation per topic at a time, on the
    creation threads; ``request`` never waits for ZooKeeper nor takes the metadata lock."""

    def __init__(self, metadata: Any,
                 submit_fn: Callable[[Callable[[], Any]], concurrent.futures.Future] = submit):
        self._metadata = metadata
        self._submit = submit_fn
        self._lock = threading.Lock()
        self._inflight: dict[str, concurrent.futures.Future] = {}
        self._failed: dict[str, ErrorCode] = {}   # a creation's error, for the next request

    def request(self, name: str) -> ErrorCode:
        """Starts creating ``name`` unless it is under way: LEADER_NOT_AVAILABLE (the client
        asks again), INVALID_TOPIC_EXCEPTION for a name no topic may have, or the error the
        last attempt ended with (once; the request after it tries again)."""
        if invalid_topic_reason(name) is not None:
            return ErrorCode.INVALID_TOPIC_EXCEPTION
        with self._lock:
            failed = self._failed.pop(name, None)
            if failed is not None:
                return failed
            if name not in self._inflight:
                self._inflight[name] = self._submit(lambda: self._create(name))
        return ErrorCode.LEADER_NOT_AVAILABLE

    def inflight(self) -> list[concurrent.futures.Future]:
        with self._lock:
            return list(self._inflight.values())

    def _create(self, name: str) -> None:
        error = None
        try:
            self._metadata.create_topic(name)
            log.info("auto-created topic %s", name)
        except KafkaError as exc:
            # written but not yet seen by this broker's view, or made by someone else: done
            if exc.code not in (ErrorCode.TOPIC_ALREADY_EXISTS, ErrorCode.REQUEST_TIMED_OUT):
                log.info("auto-creation of topic %s failed: %s", name, exc)
                error = ErrorCode(exc.code)
        except Exception:  # noqa: BLE001 - a worker must not lose the topic's in-flight mark
            log.exception("auto-creation of topic %s failed", name)
            error = ErrorCode.UNKNOWN_SERVER_ERROR
        finally:
            with self._lock:
                self._inflight.pop(name, None)
                if error is not None:
                    self._failed[name] = error


_creators: "weakref.WeakKeyDictionary[Any, AutoTopicCreator]" = weakref.WeakKeyDictionary()
_creators_lock = threading.Lock()


def auto_topic_creator(metadata: Any) -> AutoTopicCreator:
    """The one creator of a broker's metadata."""
    with _creators_lock:
        creator = _creators.get(metadata)
        if creator is None:
            creator = _creators[metadata] = AutoTopicCreator(metadata)
        return creator
