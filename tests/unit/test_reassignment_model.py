"""The controller model of ``test_controller_model.py`` with partition reassignments (KIP-455)
and their cancellation among its random steps. Every invariant of that model still holds (one
leader per leader epoch, leader in the ISR, ISR a subset of the replicas, writes replaying to
the image, ...), and also:

- a reassignment's adding and removing replicas are disjoint parts of the replicas, and its
  target (replicas - removing) is never empty;
- no reassignment stays in progress once its target replicas are all in the ISR (every event
  completes those it brought in sync);
- the writes carry the reassignment fields: a reloaded image (a new controller) has them;
- a request's answer is Kafka's: UNKNOWN_TOPIC_OR_PARTITION, NO_REASSIGNMENT_IN_PROGRESS for a
  cancel of nothing, INVALID_REPLICA_ASSIGNMENT for an empty, duplicated or not-alive target,
  else NONE with replicas = target + original (or the target once complete);
- a leader comes from outside the previous ISR only when a cancel leaves no original replica
  in the ISR (then it is an unclean election: ISR = the leader, RECOVERING).

``STRATA_CONTROLLER_EXAMPLES`` raises the example count, as for the base model.
"""

from __future__ import annotations

import os
from dataclasses import replace

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule

from strata.cluster.controller_events import (
    AlterPartition, CreateTopic, DeleteTopic, PartitionReassignmentRequested, SetTopicAssignment)
from strata.cluster.image import frozen_map
from strata.common.errors import ErrorCode
from strata.common.types import TopicPartition
from test_controller_model import BROKERS, NAMES, ControllerMatchesModel, VersionedStore


class ReassigningStore(VersionedStore):
    """The base store, also keeping each topic's adding and removing replicas."""

    def __init__(self):
        super().__init__()
        self.reassigning: dict[str, tuple[dict, dict]] = {}

    def apply(self, write) -> None:
        super().apply(write)
        if isinstance(write, CreateTopic):
            self.reassigning[write.topic] = ({}, {})
        elif isinstance(write, SetTopicAssignment):
            self.reassigning[write.topic] = (dict(write.adding_replicas),
                                             dict(write.removing_replicas))
        elif isinstance(write, DeleteTopic):
            del self.reassigning[write.topic]

    def reload(self, image):
        reloaded = super().reload(image)
        topics = {name: replace(t, adding_replicas=frozen_map(self.reassigning[name][0]),
                                removing_replicas=frozen_map(self.reassigning[name][1]))
                  for name, t in reloaded.topics.items()}
        return replace(reloaded, topics=frozen_map(topics))


class ReassignmentModel(ControllerMatchesModel):
    def __init__(self):
        super().__init__()
        self.store = ReassigningStore()
        self._proposal = None

    def apply(self, event, unclean_allowed=None):
        self._proposal = event if isinstance(event, AlterPartition) else None
        return super().apply(event, unclean_allowed)

    def check_transition(self, before, result, unclean_allowed):
        """An accepted ISR proposal that completes a reassignment may move the leader to a
        replica it just added to the ISR: the leader is judged against that ISR."""
        proposal = self._proposal
        if proposal is not None and result.response.error == ErrorCode.NONE and result.writes:
            tp = TopicPartition(proposal.topic, proposal.partition)
            topic = before.topics[tp.topic]
            old = topic.partitions[tp.partition]
            reg = replace(old, isr=tuple(dict.fromkeys(old.isr + proposal.new_isr)))
            before = replace(before, topics=frozen_map({**before.topics, tp.topic: replace(
                topic, partitions=frozen_map({**topic.partitions, tp.partition: reg}))}))
        super().check_transition(before, result, unclean_allowed)

    def isr_after_proposal(self, tp, new_isr):
        """A proposal that puts the whole target in the ISR completes the reassignment: the
        replicas being removed leave the ISR with it."""
        topic = self.image.topics[tp.topic]
        if topic.is_reassigning(tp.partition) and \
                set(topic.target_replicas(tp.partition)) <= set(new_isr):
            removing = topic.removing_replicas.get(tp.partition, ())
            return tuple(r for r in new_isr if r not in removing)
        return new_isr

    @rule(name=st.sampled_from(NAMES), partition=st.integers(0, 2),
          replicas=st.none() | st.lists(st.sampled_from(BROKERS + (9,)), max_size=3))
    def reassign(self, name, partition, replicas):
        tp = TopicPartition(name, partition)
        before = self.image
        topic = before.topics.get(name)
        exists = topic is not None and partition < len(topic.assignment)
        target = None if replicas is None else tuple(replicas)
        expected = self.expected_error(tp, target)
        unclean = False
        if expected == ErrorCode.NONE:
            original = topic.original_replicas(partition)
            reg = before.registration(tp)
            # replicas that leave at once (added ones no longer wanted) may have been the whole
            # ISR: then one of the kept replicas is elected unclean
            kept = set(target or ()) | set(original)
            unclean = reg is not None and not set(reg.isr) & kept
        result = self.apply(PartitionReassignmentRequested({tp: target}),
                            unclean_allowed=unclean or None)
        code, _ = result.response[tp]
        assert code == expected, (tp, target, result.response)
        if code != ErrorCode.NONE:
            assert result.writes == () and result.image is before
            return
        assert exists
        after = self.image.topics[name]
        wanted = target if target is not None else original
        full = tuple(dict.fromkeys(wanted + original))
        if after.is_reassigning(partition):
            event("reassignment in progress")
            assert after.assignment[partition] == full
        else:
            event("reassignment done at once" if target is not None else "reassignment cancelled")
            assert after.assignment[partition] in (wanted, full)  # full: nothing added or removed

    def expected_error(self, tp, target) -> ErrorCode:
        topic = self.image.topics.get(tp.topic)
        if topic is None or tp.partition >= len(topic.assignment):
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        if target is None:
            in_progress = topic.is_reassigning(tp.partition)
            return ErrorCode.NONE if in_progress else ErrorCode.NO_REASSIGNMENT_IN_PROGRESS
        original = topic.original_replicas(tp.partition)
        if not target or len(set(target)) != len(target) or not all(
                self.image.is_eligible(b) for b in target if b not in original):
            return ErrorCode.INVALID_REPLICA_ASSIGNMENT
        return ErrorCode.NONE

    @invariant()
    def reassignments_are_consistent(self):
        for name, topic in self.image.topics.items():
            for p in set(topic.adding_replicas) | set(topic.removing_replicas):
                replicas = set(topic.assignment[p])
                adding = set(topic.adding_replicas.get(p, ()))
                removing = set(topic.removing_replicas.get(p, ()))
                assert adding <= replicas and removing <= replicas and not adding & removing
                assert topic.target_replicas(p)
                reg = topic.partitions.get(p)
                assert reg is None or not set(topic.target_replicas(p)) <= set(reg.isr), \
                    f"{name}-{p}: target {topic.target_replicas(p)} in sync but not completed"

    @invariant()
    def writes_replay_the_reassignments(self):
        for name, topic in self.image.topics.items():
            assert self.store.reassigning[name] == (dict(topic.adding_replicas),
                                                    dict(topic.removing_replicas))


ReassignmentModel.TestCase.settings = settings(
    max_examples=int(os.environ.get("STRATA_CONTROLLER_EXAMPLES", "300")),
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestReassignmentModel = ReassignmentModel.TestCase
