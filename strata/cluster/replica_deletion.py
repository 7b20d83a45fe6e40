"""Which of its replicas a broker deletes when its view of the cluster changes.

The rule, Kafka's deletion lifecycle: a replica's directory is deleted only when the cluster's
metadata records that it must go, i.e.

- its topic was deleted: the topic (that topic id) was in the old image and is not in the new
  one, or its name now belongs to another topic id (deleted, then created again);
- it was reassigned away: the topic is still there and its assignment no longer names this
  broker (a reassignment in progress keeps the original replicas in the assignment, so this
  only happens once it completed or was cancelled away from this broker).

Both images must be whole reads of the authoritative store. A view that is closing, lost its
session or is being re-read is no evidence of anything: ``view_change`` names those cases and
the ZooKeeper view applies only ``ViewChange.READ`` images (``zk.view``). Pure functions over
immutable images; any thread may call them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from strata.cluster.image import MetadataImage, TopicImage
from strata.common.types import TopicPartition


class ViewChange(enum.Enum):
    """Why a broker's view built a new image, and so whether it may be applied."""

    READ = "read"              # the store changed; the view's caches are whole and live
    INCOMPLETE = "incomplete"  # session lost or caches being re-read: not the store's state
    CLOSING = "closing"        # the view is closing and its caches are being emptied


def view_change(*, closed: bool, whole: bool) -> ViewChange:
    """The kind of an image built by a view that is ``closed`` or not, from caches that are
    ``whole`` (read entirely in a live session) or not. Only READ images are applied."""
    if closed:
        return ViewChange.CLOSING
    return ViewChange.READ if whole else ViewChange.INCOMPLETE


@dataclass(frozen=True)
class ReplicaDeletions:
    """What a change of the image deletes: ``topics`` (as the old image held them) whose
    deletion it records, cluster-wide; ``replicas``, this broker's replicas to delete (those
    of the deleted topics and those reassigned away)."""

    topics: tuple[TopicImage, ...] = ()
    replicas: frozenset[TopicPartition] = frozenset()


def replica_deletions(broker_id: int, old: MetadataImage, new: MetadataImage) -> ReplicaDeletions:
    """The deletions that going from ``old`` to ``new`` (both READ images) records for broker
    ``broker_id``."""
    deleted: list[TopicImage] = []
    replicas: set[TopicPartition] = set()
    for name in sorted(old.topics):
        before = old.topics[name]
        now = new.topics.get(name)
        if now is None or now.topic_id != before.topic_id:
            deleted.append(before)
            replicas.update(TopicPartition(name, p) for p, r in enumerate(before.assignment)
                            if broker_id in r)
            continue
        for p, r in enumerate(before.assignment):
            if broker_id in r and p < len(now.assignment) and broker_id not in now.assignment[p]:
                replicas.add(TopicPartition(name, p))
    return ReplicaDeletions(tuple(deleted), frozenset(replicas))
