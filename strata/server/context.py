"""What every request handler may use: the broker's parts, built once by the CLI."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from strata.cluster.client_quotas import ClientQuotaStore
from strata.replication.replica_manager import ReplicaManager
from strata.security.authorizer import Authorizer
from strata.security.session import AuthenticationStats
from strata.server.purgatory import PartitionWatchers

if TYPE_CHECKING:
    from strata.cluster.delegation_tokens import DelegationTokenManager
    from strata.server.fetch_session import FetchSessionCache


@dataclass
class BrokerContext:
    node_id: int
    advertised_host: str
    advertised_port: int
    metadata: Any                      # strata.cluster.metadata.ClusterMetadata
    replica_manager: ReplicaManager
    fetch_watchers: PartitionWatchers = field(default_factory=PartitionWatchers)
    auto_create_topics: bool = True
    group_coordinator: Any = None      # strata.coordinator.group.GroupCoordinator
    offsets_log: Any = None            # strata.coordinator.offsets_log.ReplicaOffsetsLog
    producer_ids: Any = None           # strata.coordinator.producer_id_manager.ProducerIdManager
    txn_coordinator: Any = None        # strata.coordinator.txn_coordinator.TransactionCoordinator
    txn_log: Any = None                # __transaction_state's ReplicaOffsetsLog
    txn_verifier: Any = None           # strata.server.txn_verification.TxnVerifier (KIP-890)
    client_quotas: ClientQuotaStore = field(default_factory=ClientQuotaStore)  # in memory by default
    quotas: Any = None                 # strata.server.quotas.ClientQuotaManager; None: not enforced
    remote_fetch_max_wait_ms: int = 500  # remote.fetch.max.wait.ms
    fetch_max_bytes: int = 57_671_680    # fetch.max.bytes: caps a Fetch request's max_bytes
    api_versions: dict = field(default_factory=dict)  # what ApiVersions advertises; set by the Dispatcher
    inter_broker_security: Any = None    # net.connection.ClientSecurity to other brokers, or None
    authentication_stats: AuthenticationStats = field(default_factory=AuthenticationStats)
    failed_authentication_delay_ms: int = 100   # connection.failed.authentication.delay.ms
    eligible_leader_replicas: bool = True     # eligible.leader.replicas.enable (ApiVersions)
    authorizer: Authorizer | None = None   # None: every request allowed (no authorizer.class.name)
    fetch_sessions: FetchSessionCache | None = None   # KIP-227; None: every Fetch sessionless
    txn_marker_timeout_s: float = 30.0   # request.timeout.ms
    delegation_tokens: DelegationTokenManager | None = None   # KIP-48; None: tokens disabled

    def __post_init__(self) -> None:
        # Clients learn this broker's endpoint from the metadata (Metadata, FindCoordinator, ...)
        if self.advertised_host and hasattr(self.metadata, "advertised_endpoints"):
            self.metadata.advertised_endpoints = {
                "PLAINTEXT": (self.advertised_host, self.advertised_port)}
