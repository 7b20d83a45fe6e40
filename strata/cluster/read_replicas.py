"""What the cluster metadata and the request handlers ask of the remote read replicas (issue 52;
``strata.tiered.bucket.read_replica.ReadReplicaManager``), and the null object a broker has
without them (a ZooKeeper cluster's broker, a test's stand-in): it serves no topic."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from strata.common.types import TopicPartition


class ReadReplicas(Protocol):
    def plan(self, topic: str, configs: Mapping[str, Any]) -> Any: ...
    def serves(self, topic: str) -> bool: ...
    def write_refusal(self, topic: str) -> str: ...
    def read_state(self, tp: TopicPartition, fetch_offset: int) -> Any: ...
    def list_offset(self, tp: TopicPartition, timestamp: int) -> Any: ...
    def close(self) -> None: ...


class NoReadReplicas:
    """No read replicas: no topic is one, so the handlers never ask for the rest."""

    def plan(self, topic: str, configs: Mapping[str, Any]) -> Any:
        raise AssertionError("no read replicas on this broker (ClusterMetadata checks first)")

    def serves(self, topic: str) -> bool:
        return False

    def write_refusal(self, topic: str) -> str:
        raise AssertionError(f"{topic} is not a read replica")

    def read_state(self, tp: TopicPartition, fetch_offset: int) -> Any:
        raise AssertionError(f"{tp} is not a read replica")

    def list_offset(self, tp: TopicPartition, timestamp: int) -> Any:
        raise AssertionError(f"{tp} is not a read replica")

    def close(self) -> None:
        pass


NO_READ_REPLICAS = NoReadReplicas()
