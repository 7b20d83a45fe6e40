"""ReplicaManagers as a broker alone runs them: a cluster of one, granted every partition
(leader at epoch 0, the ISR itself), as the broker's metadata grants them."""

from __future__ import annotations

from strata.broker.metadata_publisher import GrantedStatesPublisher
from strata.cluster.image import PartitionState


def lead_alone(replicas, *partitions):
    """Grant ``replicas`` the leadership of ``partitions``, its broker the only replica."""
    me = (replicas.broker_id,)
    return replicas.apply_states({tp: PartitionState(replicas.broker_id, 0, me, me)
                                  for tp in partitions})


def follow_grants(metadata, replicas):
    """``replicas`` takes every partition one broker's ``metadata`` has and will have."""
    metadata.add_listener(GrantedStatesPublisher(replicas))
    replicas.apply_states(metadata.hosted_states())
    return replicas
