"""What every request handler may use: the broker's parts, each behind a declared port
(``strata.server.ports``), built once by ``strata.broker`` and passed to the constructor.
Optional features are null objects (fetch sessions) or ``None`` where Kafka answers an error
of its own (no transaction coordinator: COORDINATOR_NOT_AVAILABLE; no token manager:
DELEGATION_TOKEN_AUTH_DISABLED; no authorizer: every request allowed)."""

from __future__ import annotations

from dataclasses import dataclass, field

from strata.cluster.client_quotas import ClientQuotaStore
from strata.net.connection import ClientSecurity
from strata.security.authorizer import Authorizer
from strata.security.session import AuthenticationStats
from strata.server.broker_metrics import BrokerTopicStats
from strata.server.fetch_session import NO_SESSIONS
from strata.server.ports import (
    ClientQuotasPort, ClusterMetadataPort, DelegationTokensPort, FetchSessionsPort,
    GroupCoordinatorPort, InternalTopicLogPort, PartitionWatchersPort, ProducerIdsPort,
    QuotaManagerPort, ReplicaManagerPort, TxnCoordinatorPort, TxnVerifierPort)
from strata.server.purgatory import PartitionWatchers


def _advertised_api_versions() -> dict[int, tuple[int, int]]:
    from strata.server.dispatch import advertised_versions   # dispatch imports the handlers
    return advertised_versions()


@dataclass(frozen=True)
class BrokerContext:
    """Frozen: every part is given to the constructor (a test varies one with
    ``dataclasses.replace``)."""

    node_id: int
    advertised_host: str
    advertised_port: int
    metadata: ClusterMetadataPort
    replica_manager: ReplicaManagerPort
    fetch_watchers: PartitionWatchersPort = field(default_factory=PartitionWatchers)
    auto_create_topics: bool = True
    group_coordinator: GroupCoordinatorPort | None = None   # None: COORDINATOR_NOT_AVAILABLE
    offsets_log: InternalTopicLogPort | None = None         # __consumer_offsets
    producer_ids: ProducerIdsPort | None = None
    txn_coordinator: TxnCoordinatorPort | None = None
    txn_log: InternalTopicLogPort | None = None             # __transaction_state
    txn_verifier: TxnVerifierPort | None = None   # KIP-890; None: transaction.partition.verification.enable=false
    client_quotas: ClientQuotasPort = field(default_factory=ClientQuotaStore)  # in memory by default
    quotas: QuotaManagerPort | None = None        # None: client quotas not enforced
    remote_fetch_max_wait_ms: int = 500  # remote.fetch.max.wait.ms
    fetch_max_bytes: int = 57_671_680    # fetch.max.bytes: caps a Fetch request's max_bytes
    # what ApiVersions advertises: the versions of the APIs the Dispatcher has handlers for
    api_versions: dict[int, tuple[int, int]] = field(default_factory=_advertised_api_versions)
    inter_broker_security: ClientSecurity | None = None   # to other brokers; None: PLAINTEXT
    authentication_stats: AuthenticationStats = field(default_factory=AuthenticationStats)
    topic_stats: BrokerTopicStats = field(default_factory=BrokerTopicStats)   # BrokerTopicMetrics
    failed_authentication_delay_ms: int = 100   # connection.failed.authentication.delay.ms
    eligible_leader_replicas: bool = True     # eligible.leader.replicas.enable (ApiVersions)
    features: Any = None   # strata.cluster.features.FinalizedFeatures (UpdateFeatures); None: fixed
    authorizer: Authorizer | None = None   # None: every request allowed (no authorizer.class.name)
    fetch_sessions: FetchSessionsPort = NO_SESSIONS   # KIP-227; NO_SESSIONS: every Fetch sessionless
    txn_marker_timeout_s: float = 30.0   # request.timeout.ms
    delegation_tokens: DelegationTokensPort | None = None   # KIP-48; None: tokens disabled

    def __post_init__(self) -> None:
        # Clients learn this broker's endpoint from the metadata (Metadata, FindCoordinator, ...)
        if self.advertised_host:
            self.metadata.advertised_endpoints = {
                "PLAINTEXT": (self.advertised_host, self.advertised_port)}
