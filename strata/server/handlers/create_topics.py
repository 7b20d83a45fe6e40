"""CreateTopics v2-7: one result per topic; v5+ also returns the partitions, replication
factor and configs of each created (or, with validate_only, validated) topic.

The topics are created side by side on creation threads (``strata.server.topic_creation``:
each may wait for ZooKeeper and for its partitions' leaders), never on the event loop. The
request's ``timeout_ms`` bounds the wait: a topic not created by then answers REQUEST_TIMED_OUT
and its creation goes on; with a timeout of 0 or less the topics are validated, each valid
one answers REQUEST_TIMED_OUT and is then created (Kafka's ZooKeeper-mode AdminManager).
validate_only waits for the validation whatever the timeout. A request whose topics would add
more than Kafka's ``MAX_RECORDS_PER_USER_OP`` records is refused whole before anything is
written."""

from __future__ import annotations

import logging

from strata.cluster.metadata import check_records_per_operation
from strata.common.errors import ErrorCode
from strata.protocol.codec import kio_error_code, make, response_class
from strata.server.handlers.admin_common import attempt, duplicates
from strata.security.authorizer import CLUSTER_NAME, AclOperation, ResourceType
from strata.server.authorization import NOTHING_DENIED, authorize, denied_topics
from strata.server.quotas import UNBOUNDED_MUTATION_QUOTA, mutation_quota
from strata.server.topic_creation import run_all, submit

log = logging.getLogger(__name__)
FIRST_VERSION_WITH_CONFIGS = 5


def _create(ctx, t, validate_only: bool, charged: bool = True):
    """Creates (or validates) ``t``; ``charged``: through the request's mutation quota."""
    configs = {c.name: c.value for c in t.configs}
    assignments = {a.partition_index: list(a.broker_ids) for a in t.assignments}

    def create():
        return ctx.metadata.create_topic(t.name, t.num_partitions, t.replication_factor, configs,
                                         validate_only=validate_only,
                                         assignments=assignments or None)
    if not charged:
        return create()
    return mutation_quota().apply(create, lambda info: info.partitions)


def _records(ctx, t) -> int:
    """The controller records creating ``t`` writes: the topic, its partitions, its configs."""
    if ctx.metadata.topic(t.name) is not None:
        return 0
    partitions = len(t.assignments) if t.assignments else max(t.num_partitions, 1)
    return 1 + partitions + len(t.configs)


def _authorize(ctx, body) -> tuple[frozenset[str], frozenset[str]]:
    """Kafka's checks of a CreateTopics: the topics the caller may not create (CREATE on the
    cluster, else on each topic), and those whose configs it may not see (DESCRIBE_CONFIGS)."""
    if ctx.authorizer is None:
        return NOTHING_DENIED, NOTHING_DENIED
    names = [t.name for t in body.topics]
    not_creatable = NOTHING_DENIED
    if not authorize(ctx, AclOperation.CREATE, ResourceType.CLUSTER, CLUSTER_NAME,
                     log_if_denied=False):
        not_creatable = denied_topics(ctx, AclOperation.CREATE, names)
    return not_creatable, denied_topics(ctx, AclOperation.DESCRIBE_CONFIGS, names,
                                        log_if_denied=False)


def _checked(ctx, body, denied=NOTHING_DENIED) -> list[tuple]:
    """(topic, code, message) per requested topic, in request order, from the checks made
    before any creation (code None: to be created); ``denied`` topics are not created
    (TOPIC_AUTHORIZATION_FAILED)."""
    dups = duplicates(t.name for t in body.topics)
    _, code, message = attempt(lambda: check_records_per_operation(
        sum(_records(ctx, t) for t in body.topics if t.name not in dups and t.name not in denied)))
    if code != ErrorCode.NONE:
        return [(t, code, message) for t in body.topics]
    out = []
    for t in body.topics:
        if t.name in dups:
            out.append((t, ErrorCode.INVALID_REQUEST, "Duplicate topic name."))
        elif t.name in denied:
            out.append((t, ErrorCode.TOPIC_AUTHORIZATION_FAILED, "Authorization failed."))
        elif len({c.name for c in t.configs}) != len(t.configs):
            out.append((t, ErrorCode.INVALID_REQUEST, "Duplicate config names."))
        else:
            out.append((t, None, None))
    return out


def _outcome(future):
    """A finished creation's result; an unexpected failure as UNKNOWN_SERVER_ERROR (logged)."""
    exc = future.exception()
    if exc is None:
        return future.result()
    log.error("topic creation failed", exc_info=exc)
    return None, ErrorCode.UNKNOWN_SERVER_ERROR, None


async def _results(ctx, body, denied=NOTHING_DENIED) -> list[tuple]:
    """(topic, info, code, message) per requested topic, in request order."""
    checked = _checked(ctx, body, denied)
    todo = [t for t, code, _ in checked if code is None]
    timeout_s = body.timeout.total_seconds()
    fire = timeout_s <= 0 and not body.validate_only
    validate_only = body.validate_only or fire
    fns = [lambda t=t: attempt(lambda: _create(ctx, t, validate_only)) for t in todo]
    if mutation_quota() is not UNBOUNDED_MUTATION_QUOTA:
        # a bounded quota is checked and charged topic by topic, in order, as Kafka does
        fns = [lambda fns=fns: [fn() for fn in fns]]
        futures = await run_all(fns, None if validate_only else timeout_s)
        done = _outcome(futures[0]) if futures[0].done() else [None] * len(todo)
        if isinstance(done, tuple):   # the one task failed
            done = [done] * len(todo)
    else:
        futures = await run_all(fns, None if validate_only else timeout_s)
        done = [_outcome(f) if f.done() else None for f in futures]
    by_name = dict(zip((t.name for t in todo), done))
    out = []
    for t, code, message in checked:
        if code is not None:
            out.append((t, None, code, message))
            continue
        result = by_name[t.name]
        if result is None:   # still being created
            out.append((t, None, ErrorCode.REQUEST_TIMED_OUT, None))
        elif fire and result[1] == ErrorCode.NONE:
            submit(lambda t=t: attempt(lambda: _create(ctx, t, False, charged=False)))
            out.append((t, None, ErrorCode.REQUEST_TIMED_OUT, None))
        else:
            out.append((t, *result))
    return out


async def handle(ctx, request):
    body = request.body
    rc = response_class(request.api_key, request.api_version)
    not_creatable, hidden_configs = _authorize(ctx, body)
    results = []
    for t, info, code, message in await _results(ctx, body, not_creatable):
        if info is None:
            results.append(make(rc, "topics", name=t.name, error_code=kio_error_code(code),
                                error_message=message, num_partitions=-1,
                                replication_factor=-1, configs=None))
            continue
        if t.name in hidden_configs:   # created, but its configs are not the caller's to see
            results.append(make(rc, "topics", name=t.name, topic_id=info.topic_id,
                                num_partitions=-1, replication_factor=-1, configs=(),
                                topic_config_error_code=kio_error_code(
                                    ErrorCode.TOPIC_AUTHORIZATION_FAILED)))
            continue
        configs = None
        if request.api_version >= FIRST_VERSION_WITH_CONFIGS:
            configs = tuple(
                make(rc, "topics.configs", name=e.name, value=e.value, read_only=e.read_only,
                     config_source=int(e.source), is_sensitive=e.is_sensitive)
                for e in ctx.metadata.config_entries(info))
        results.append(make(rc, "topics", name=t.name, topic_id=info.topic_id,
                            num_partitions=info.partitions, replication_factor=1,
                            configs=configs))
    return make(rc, topics=tuple(results))
