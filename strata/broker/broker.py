"""The broker (Kafka's ``BrokerServer``): ``Broker.build(props)`` constructs every part from the
server properties, each given its collaborators, and starts those that load state (logs,
ZooKeeper's view, coordinators); ``serve`` binds the listeners, registers in the cluster,
serves until ``stop`` is set and shuts down. ``strata.cli.main`` parses arguments and runs one."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
import time
from pathlib import Path

from strata.common.errors import KafkaError
from strata.common.files import raise_descriptor_limit
from strata.common.late_bound import LateBound
from strata.common.scheduler import KafkaScheduler
from strata.common.types import TopicPartition
from strata.log.log_manager import LogManager

log = logging.getLogger("strata")
# How long SIGTERM waits for the controller to move this broker's leaderships away (Kafka
# retries controlled.shutdown.max.retries=3 times, 5 s apart).
CONTROLLED_SHUTDOWN_WAIT_S = 15


def _int(props: dict[str, str], key: str, default: int | None = None) -> int:
    """``key`` as an int; unset, ``default`` or else the key's default as DescribeConfigs
    reports it (``BROKER_CONFIG_KEYS``), so the two cannot differ."""
    if key in props:
        return int(props[key])
    if default is None:
        from strata.cluster.metadata import BROKER_CONFIG_KEYS
        default = BROKER_CONFIG_KEYS[key].default
    return int(default)


def _flag(props: dict[str, str], key: str) -> bool:
    """A boolean ``key``, unset meaning its ``BROKER_CONFIG_KEYS`` default."""
    from strata.cluster.metadata import BROKER_CONFIG_KEYS
    return props.get(key, BROKER_CONFIG_KEYS[key].default).strip().lower() == "true"


def _tier_bootstrap_guard(props: dict[str, str], manager, metadata):
    """KIP-1303's guard on this broker's replicas rebuilt from the remote tier."""
    from strata.replication.tier_bootstrap_guard import (
        LOCAL_LOG_BYTES_CONFIG, LOCAL_LOG_MS_CONFIG, TierBootstrapGuard)
    return TierBootstrapGuard(
        lambda tp: (ulog.size if (ulog := manager.get_log(tp)) is not None else None),
        metadata, local_log_ms=_int(props, LOCAL_LOG_MS_CONFIG),
        local_log_min_bytes=_int(props, LOCAL_LOG_BYTES_CONFIG))


def _guarded_aux_state(rlm, guard):
    """The remote log manager's rebuild from the remote tier; a rebuilt replica is guarded."""
    def build(ulog, target_epoch: int, leader_local_start: int, leader_start: int) -> int:
        out = rlm.build_remote_log_aux_state(ulog, target_epoch, leader_local_start, leader_start)
        guard.bootstrapped(ulog.topic_partition)
        return out
    return build


DEFAULT_LISTENERS = "PLAINTEXT://127.0.0.1:9092"   # Strata's: make run listens on loopback


def _listeners(props: dict[str, str]):
    """Kafka's listener settings (``strata.common.listeners``)."""
    from strata.common.listeners import parse_listeners
    return parse_listeners({"listeners": DEFAULT_LISTENERS, **props})


def _inter_broker_security(props: dict[str, str]):
    """How this broker's connections reach the others' inter-broker listener: TLS and/or a
    SASL login with this broker's credentials there; None when that listener is PLAINTEXT."""
    from strata.net.connection import ClientSecurity
    from strata.net.tls import client_context
    listeners = _listeners(props)
    name, listener = listeners.inter_broker_listener, listeners.inter_broker
    if not (listener.tls or listener.sasl):
        return None
    sasl = {}
    if listener.sasl:
        from strata.security.sasl_client import inter_broker_credentials, new_client
        credentials = inter_broker_credentials(props, name)
        sasl = {"sasl_mechanism": credentials.mechanism,
                "sasl_client": lambda host: new_client(credentials, host)}
    return ClientSecurity(client_context(props, name) if listener.tls else None, **sasl)


def _transaction_coordinator(props, metadata, txn_log, producer_ids, markers, loop, *,
                             clustered: bool, features):
    """The transaction coordinator over ``__transaction_state`` (``txn_log``), sending its
    markers with ``markers``; on one broker it loads every partition of the topic, now if it
    exists, else once it is made."""
    from strata.broker.metadata_publisher import TransactionStateLoader
    from strata.coordinator.txn_coordinator import TransactionCoordinator, TxnCoordinatorConfig
    from strata.coordinator.txn_records import TRANSACTION_STATE_TOPIC
    existing = metadata.topic(TRANSACTION_STATE_TOPIC)
    config = dataclasses.replace(
        TxnCoordinatorConfig.from_properties(props),
        num_partitions=existing.partitions if existing else txn_log.configured_partitions)
    from strata.cluster.features import TRANSACTION_VERSION
    coordinator = TransactionCoordinator(
        txn_log, producer_ids.generate, markers, config,
        topic_exists=lambda topic: metadata.topic(topic) is not None,
        transaction_version=lambda: features.level(TRANSACTION_VERSION))
    if not clustered:
        if existing is not None:
            coordinator.load({p: 0 for p in range(existing.partitions)})
        metadata.add_listener(TransactionStateLoader(loop, coordinator))
    coordinator.start()
    return coordinator


def _join_cluster(props: dict[str, str], node_id: int):
    """The ZooKeeper client when ``zookeeper.connect`` is set (connected, top-level paths
    made), else None."""
    from strata.cluster.zk.client import StrataZkClient
    from strata.cluster.zk.config import ZkClientConfig
    config = ZkClientConfig.from_properties(props)
    if config is None:
        return None
    zk = StrataZkClient(config).start()
    zk.create_top_level_paths()
    log.info("broker %d connected to ZooKeeper at %s", node_id, config.connect)
    return zk


def _register(zk, metadata, node_id: int, endpoints: tuple, rack: str | None,
              clean_shutdown: bool = True):
    """``/brokers/ids/N`` now and again after every new session (Kafka's registration); the
    metadata hears each registration's epoch (``on_registered``). It names the log directory
    (KIP-858) and whether the logs had been closed cleanly; a new session of this process
    lost nothing, so it registers clean."""
    from strata.cluster.image import BrokerRegistration
    from strata.cluster.metadata import ZERO_UUID
    from strata.cluster.zk.client import StateChangeHandler
    from strata.cluster.zk.client import ZkNodeExistsError
    directories = () if metadata.directory_id == ZERO_UUID else (metadata.directory_id,)
    registration = BrokerRegistration(node_id, rack, endpoints,
                                      directory_ids=directories, clean_shutdown=clean_shutdown)
    # A broker restarted right after a crash finds its previous session's registration still
    # there; Kafka's ZooKeeper mode gives up at once, Strata waits (at most one session
    # timeout) for ZooKeeper to expire it. Another live broker with this id is still refused.
    deadline = time.monotonic() + zk.config.session_timeout_ms / 1000 + 5
    while True:
        try:
            metadata.on_registered(zk.register_broker(registration))
            break
        except ZkNodeExistsError as exc:
            if time.monotonic() > deadline:
                raise
            log.info("waiting for the previous registration of broker %d to expire: %s", node_id, exc)
            time.sleep(0.5)
    again = dataclasses.replace(registration, clean_shutdown=True)
    zk.register_state_change_handler(StateChangeHandler(
        "broker-registration",
        after_initializing_session=lambda: metadata.on_registered(zk.register_broker(again))))


RACK_AWARE_SELECTOR = "org.apache.kafka.common.replica.RackAwareReplicaSelector"
LEADER_SELECTOR = "org.apache.kafka.common.replica.LeaderSelector"


def _rack_aware_selector(props: dict[str, str]) -> bool:
    """``replica.selector.class``: Kafka's RackAwareReplicaSelector (KIP-392), or the leader."""
    name = (props.get("replica.selector.class") or "").strip()
    if name not in ("", RACK_AWARE_SELECTOR, LEADER_SELECTOR):
        raise SystemExit(f"replica.selector.class: {name} is not one Strata has "
                         f"({RACK_AWARE_SELECTOR} or {LEADER_SELECTOR})")
    return name == RACK_AWARE_SELECTOR


def _replication_quotas(node_id: int, metadata):
    """(leader, follower) replication throttles (KIP-73): the dynamic rates, applied to the
    partitions each topic's *.replication.throttled.replicas names for this broker."""
    from strata.broker.metadata_publisher import ReplicationThrottlesPublisher
    from strata.log.log_config import (
        FOLLOWER_THROTTLED_REPLICAS, LEADER_THROTTLED_REPLICAS, throttled_partitions)
    from strata.replication.quota import replication_quotas

    def throttled(key: str):
        def check(tp: TopicPartition) -> bool:
            parts = throttled_partitions(metadata.log_config(tp.topic).get(key), node_id)
            return parts is None or tp.partition in parts
        return check
    leader, follower = replication_quotas(metadata.effective_broker_props(),
                                          throttled(LEADER_THROTTLED_REPLICAS),
                                          throttled(FOLLOWER_THROTTLED_REPLICAS))
    metadata.add_listener(ReplicationThrottlesPublisher(metadata, leader, follower))
    return leader, follower


def _alter_partition_manager(node_id: int, metadata, lease, security=None):
    """AlterPartition to whichever broker is the controller now, as this broker's epoch,
    held while ``lease`` is in doubt."""
    from strata.replication.alter_partition import AlterPartitionManager

    def controller():
        cid = metadata.controller_id
        found = next((b for b in metadata.live_brokers() if b.node_id == cid), None)
        return None if found is None else (cid, found.host, found.port)

    def broker_epoch() -> int:
        reg = metadata.view_image.brokers.get(node_id)
        return reg.epoch if reg is not None else -1

    return AlterPartitionManager(
        node_id, broker_epoch, controller,
        lambda topic: (t.topic_id if (t := metadata.topic(topic)) else None), lease=lease,
        security=security).start()


def _cluster_metadata_topic_log(metadata, node_id: int, props: dict[str, str]):
    """``__remote_log_metadata`` through the Kafka protocol to each partition's leader, with
    ``min.insync.replicas`` 2 (Kafka 4.3's, KIP-1235) or the replication factor if lower."""
    from strata.cluster.zk_metadata import INTERNAL_RF_KEYS, RLMM_RF_KEY
    from strata.tiered.metadata.cluster_topic_log import ClusterMetadataTopicLog
    from strata.tiered.metadata.topic_log import REMOTE_LOG_METADATA_TOPIC_NAME
    key, default = INTERNAL_RF_KEYS[REMOTE_LOG_METADATA_TOPIC_NAME]
    rf = _int(props, RLMM_RF_KEY, _int(props, key, default))

    def create_topic(num_partitions: int, configs: dict[str, str]) -> int:
        return int(metadata.create_internal_topic(REMOTE_LOG_METADATA_TOPIC_NAME, num_partitions,
                                                  configs).partitions)

    def leader_of(partition: int) -> tuple[str, int] | None:
        st = metadata.partition_state(REMOTE_LOG_METADATA_TOPIC_NAME, partition)
        if st is None or st.leader < 0:
            return None
        found = next((b for b in metadata.live_brokers() if b.node_id == st.leader), None)
        return None if found is None else (found.host, found.port)

    return ClusterMetadataTopicLog(create_topic, leader_of, client_id=f"broker-{node_id}-rlmm",
                                   min_insync_replicas=min(2, rf),
                                   security=_inter_broker_security(props))


def build_remote_log_manager(props: dict[str, str], metadata, log_manager: LogManager,
                             replica_manager, node_id: int, log_dirs: list[Path]):
    """The tiering stack when ``remote.log.storage.system.enable=true``, else None."""
    from strata.log.producer_state import AppendOrigin
    from strata.tiered.config import load_plugin
    from strata.tiered.manager.remote_index_cache import RemoteIndexCache
    from strata.tiered.manager.remote_log_manager import (
        RemoteLogManager, TieringSettings, quota_settings)
    from strata.tiered.metadata.topic_based import TopicBasedRemoteLogMetadataManager
    from strata.tiered.metadata.topic_log import REMOTE_LOG_METADATA_TOPIC_NAME, LogMetadataTopicLog

    cfg = metadata.remote_log_manager_config
    if not cfg.system_enabled:
        return None
    rsm = load_plugin(cfg.rsm_class_name)()
    rsm.configure(cfg.rsm_props(log_dirs[0]))

    def append(tp: TopicPartition, batch: bytes) -> int:
        result = replica_manager.append(tp, batch, produce_version=None,
                                        origin=AppendOrigin.COORDINATOR)
        if result.error:
            raise KafkaError(result.message or f"append to {tp} failed", code=result.error)
        return result.base_offset

    if replica_manager.clustered:
        # in a cluster the metadata partitions are replicated: published with acks=all to
        # their leaders and consumed from them, wherever they live
        topic_log = _cluster_metadata_topic_log(metadata, node_id, props)
    else:
        topic_log = LogMetadataTopicLog(metadata, get_log=replica_manager.get_log, append=append)
    rlmm_class = load_plugin(cfg.rlmm_class_name)
    # The default manager keeps its records in the __remote_log_metadata topic.
    rlmm = rlmm_class(topic_log) if issubclass(rlmm_class, TopicBasedRemoteLogMetadataManager) \
        else rlmm_class()
    rlmm.configure(cfg.rlmm_props(broker_id=node_id, cluster_id=metadata.cluster_id,
                                  log_dir=str(log_dirs[0])))
    rlmm.start()
    index_cache = RemoteIndexCache(rsm, log_dirs[0], cfg.index_cache_size_bytes)
    settings = TieringSettings(
        task_interval_ms=cfg.task_interval_ms, retry_backoff_ms=cfg.retry_backoff_ms,
        retry_backoff_max_ms=cfg.retry_backoff_max_ms, retry_jitter=cfg.retry_jitter,
        copier_threads=cfg.copier_threads, expiration_threads=cfg.expiration_threads,
        reader_threads=cfg.reader_threads, reader_max_pending_tasks=cfg.reader_max_pending_tasks,
        **quota_settings(cfg))   # static values overlaid with the stored dynamic ones
    def leader_epoch_of(tp: TopicPartition) -> int | None:
        # not while the ZooKeeper session is in doubt: another broker may lead it already
        if replica_manager.lease.in_doubt():
            return None
        st = replica_manager.state(tp)
        return st.leader_epoch if st is not None and st.leader == node_id else None

    def leads_metadata_partition(partition: int) -> bool:
        st = replica_manager.state(TopicPartition(REMOTE_LOG_METADATA_TOPIC_NAME, partition))
        return st is not None and st.leader == node_id

    rlm = RemoteLogManager(
        rsm, rlmm, broker_id=node_id, logs=log_manager.all_logs,
        topic_id=lambda topic: (t.topic_id if (t := metadata.topic(topic)) else None),
        settings=settings, index_cache=index_cache,
        leader_epoch_of=leader_epoch_of if replica_manager.clustered else None,
        leads_metadata_partition=leads_metadata_partition if replica_manager.clustered else None,
        manifests=_manifest_writer(props, metadata, rsm, rlmm))
    return rlm, cfg


def _manifest_writer(props: dict[str, str], metadata, rsm, rlmm):
    """The bucket's manifests and cluster marker (issue 52), over the object store of an
    ObjectStoreRemoteStorageManager; None with another RSM or
    ``strata.remote.manifests.enable=false``."""
    from strata.tiered.bucket.catalog import DEFAULT_LEASE_MS, BucketCatalog
    from strata.tiered.bucket.writer import (
        CLUSTER_LEASE_MS_CONFIG, DEFAULT_MANIFEST_INTERVAL_MS, MANIFEST_INTERVAL_MS_CONFIG,
        MANIFESTS_ENABLE_CONFIG, ManifestWriter)
    from strata.tiered.storage.remote_storage_manager import ObjectStoreRemoteStorageManager
    if not isinstance(rsm, ObjectStoreRemoteStorageManager) or \
            str(props.get(MANIFESTS_ENABLE_CONFIG, "true")).strip().lower() != "true":
        return None
    catalog = BucketCatalog(rsm.store, rsm.key_prefix, metadata.cluster_id,
                            lease_ms=_int(props, CLUSTER_LEASE_MS_CONFIG, DEFAULT_LEASE_MS))

    def topic_info(topic: str):
        info = metadata.topic(topic)
        return None if info is None else (info.topic_id, info.partitions, dict(info.configs))
    return ManifestWriter(catalog, rlmm, now_ms=lambda: int(time.time() * 1000),
                          interval_ms=_int(props, MANIFEST_INTERVAL_MS_CONFIG,
                                           DEFAULT_MANIFEST_INTERVAL_MS),
                          topic_info=topic_info)


def start_metrics_server(props: dict[str, str], log_manager: LogManager, rlm, metadata):
    """The metrics endpoint when ``strata.metrics.listener`` is set (serving), else None."""
    from strata.server.metrics import METRICS_LISTENER_CONFIG, MetricsServer
    listener = props.get(METRICS_LISTENER_CONFIG, "").strip()
    if not listener:
        return None
    server = MetricsServer(listener, logs=log_manager.all_logs, rlm=rlm,
                           topic_id=lambda topic: (t.topic_id if (t := metadata.topic(topic)) else None),
                           offline_log_dirs=log_manager.dir_failures.offline_log_directory_count,
                           cordoned_log_dirs=lambda: len(log_manager.cordoned))
    cache = rlm.ctx.rsm.chunk_cache if rlm is not None else None
    if cache is not None:
        server.add_stats("strata_remote_chunk_cache", cache.stats, gauges=cache.LEVEL_STATS,
                         doc="the remote storage manager's chunk cache (memory and disk tiers, prefetch)")
    server.start()
    return server



class Broker:
    """One broker's parts, built by ``build``; ``serve`` runs it until ``stop`` is set."""

    def __init__(self, *, props: dict[str, str], node_id: int, loop, zk, leadership_lease,
                 listeners, inter_broker_security, metadata, scheduler, manager: LogManager,
                 cleaner, watchers, replica_manager, rlm, ctx, dir_failures, metrics_server,
                 servers: list, stalls, alter_partition_slot: LateBound):
        self.props = props
        self.node_id = node_id
        self.loop = loop
        self.zk = zk
        self.leadership_lease = leadership_lease
        self.listeners = listeners
        self.inter_broker_security = inter_broker_security
        self.metadata = metadata
        self.scheduler = scheduler
        self.manager = manager
        self.cleaner = cleaner
        self.watchers = watchers
        self.replica_manager = replica_manager
        self.rlm = rlm
        self.ctx = ctx
        self.dir_failures = dir_failures
        self.metrics_server = metrics_server
        self.servers = servers
        self.stalls = stalls
        self.alter_partition_slot = alter_partition_slot   # set once registered (``start``)
        self.controller = None   # the ZooKeeper controller, once registered (``start``)

    @classmethod
    def build(cls, props: dict[str, str], loop: asyncio.AbstractEventLoop | None = None) -> Broker:
        """Every part, in dependency order, on the running loop (or ``loop``)."""
        from strata.broker.metadata_publisher import (
            NO_REMOTE_TIER, GrantedStatesPublisher, LeadershipPublisher, TopicLogsPublisher)
        from strata.cluster.metadata import SENDFILE_PROP, ClusterMetadata
        from strata.common.leadership_lease import ALWAYS_HELD
        from strata.coordinator.group import GroupCoordinator, GroupCoordinatorConfig
        from strata.coordinator.offsets_log import ReplicaOffsetsLog
        from strata.coordinator.producer_id_manager import ProducerIdManager
        from strata.replication.replica_manager import ReplicaManager
        from strata.server.context import BrokerContext
        from strata.server.dispatch import Dispatcher
        from strata.server.fetch_session import FetchSessionCache
        from strata.server.network import KafkaServer
        from strata.server.purgatory import PartitionWatchers
        from strata.cluster.client_quotas import ClientQuotaStore
        from strata.server.metrics import AuthenticationCollector, ClientQuotaCollector
        from strata.server.quotas import ClientQuotaManager
        from strata.log.log_cleaner import LogCleaner
        from strata.coordinator.offsets_records import OFFSETS_TOPIC
        from strata.server.log_cleaner_metrics import LogCleanerCollector
        from strata.server.txn_marker_sender import MarkerSender
        from strata.server.txn_markers import LocalMarkerTarget
        from strata.server.txn_verification import TxnVerifier

        node_id = _int(props, "node.id", _int(props, "broker.id", 1))
        log_dirs = [Path(d) for d in props.get("log.dirs", props.get("log.dir", "/tmp/kafka-logs")).split(",")]
        log_dirs[0].mkdir(parents=True, exist_ok=True)
        listeners = _listeners(props)
        inter_broker_security = _inter_broker_security(props)
        from strata.security.acl_authorizer import authorizer_enabled
        acls_enabled = authorizer_enabled(props)   # an unknown authorizer.class.name stops here
        raise_descriptor_limit()  # before ClusterMetadata, whose max.broker.partitions follows it
        loop = loop if loop is not None else asyncio.get_running_loop()
        from strata.common.watchdog import STALLS
        STALLS.watch_loop(loop)   # a loop or ZooKeeper thread stuck for 5 s logs every stack
        STALLS.start()
        zk = _join_cluster(props, node_id)
        # whether this broker may do what only a leader may: held for good without ZooKeeper
        leadership_lease = zk.leadership_lease if zk is not None else ALWAYS_HELD
        if zk is not None:
            from strata.cluster.zk_metadata import ZkClusterMetadata
            metadata = ZkClusterMetadata(log_dirs[0], node_id, props, zk)
            # the topics' configs before any log loads: a tiered log loaded with the broker
            # defaults would move its log start offset past what only the remote tier holds
            metadata.start_view()
        else:
            metadata = ClusterMetadata(log_dirs[0], node_id, props)
        scheduler = KafkaScheduler(threads=2)
        manager = LogManager(log_dirs, metadata.default_log_config(), topic_config=metadata.log_config,
                             scheduler=scheduler, dir_failures=metadata.dir_failures,
                             replicated=zk is not None)
        manager.startup()
        manager.update_cordoned_log_dirs(metadata.cordoned_log_dirs())   # KIP-1066
        cleaner = LogCleaner.from_properties(props, manager.logs_with_dirs)
        if cleaner is not None:
            cleaner.startup()
        watchers = PartitionWatchers()
        clustered = zk is not None
        leader_quota = follower_quota = None
        if clustered:   # KIP-73's replication throttles
            leader_quota, follower_quota = _replication_quotas(node_id, metadata)
        rack_aware = _rack_aware_selector(props) and clustered
        # made after the replica manager, from it: set below (the sender once registered)
        rlm_slot: LateBound = LateBound("remote log manager")
        fetchers_slot: LateBound = LateBound("follower fetchers")
        alter_partition_slot: LateBound = LateBound("AlterPartition sender")
        replica_manager = ReplicaManager(
            manager, lambda topic: (t.partitions if (t := metadata.topic(topic)) else None),
            on_append=watchers.notifier(loop),
            broker_id=node_id, clustered=clustered, lease=leadership_lease,
            replica_lag_time_max_ms=_int(props, "replica.lag.time.max.ms"),
            min_insync_replicas=lambda topic: int(
                metadata.log_config(topic).get("min.insync.replicas")),
            broker_racks=(lambda: {b.node_id: b.rack for b in metadata.live_brokers()})
            if rack_aware else None,
            broker_epoch_of=(lambda broker: (    # KIP-903
                b.epoch if (b := metadata.view_image.brokers.get(broker)) is not None else -1))
            if clustered else (lambda broker: -1),
            leader_quota=leader_quota,
            # ISR-expansion retries run on the loop, as the fetches that propose expansions do
            call_later=(lambda delay_s, fn: loop.call_soon_threadsafe(
                loop.call_later, delay_s, fn)) if clustered else None,
            remote_log_manager=rlm_slot, fetchers=fetchers_slot,
            alter_partition=alter_partition_slot)
        if zk is None:   # a cluster of one: its metadata grants this broker every partition
            metadata.add_listener(GrantedStatesPublisher(replica_manager))
            replica_manager.apply_states(metadata.hosted_states())
        tiering = build_remote_log_manager(props, metadata, manager, replica_manager, node_id, log_dirs)
        rlm = tiering[0] if tiering else None
        if rlm is not None:
            rlm_slot.set(rlm)
        if rlm is not None:
            metadata.config_validator = rlm.validate_topic_config
        remote_tier = rlm if rlm is not None else NO_REMOTE_TIER
        metadata.add_listener(TopicLogsPublisher(manager, metadata, remote_tier,
                                                 create_logs=zk is None))
        if rlm is not None and rlm.manifests is not None and zk is None:
            # issue 52: strata.remote.recovery=true (after the logs are made)
            from strata.tiered.bucket.recovery import TopicRecovery
            metadata.remote_recovery = TopicRecovery(
                rlm.manifests.catalog, rlm.ctx.rlmm, rlm.ctx.rsm, broker_id=node_id,
                now_ms=rlm.ctx.clock.milliseconds, get_log=manager.get_log, writer=rlm.manifests)
            metadata.add_listener(metadata.remote_recovery)
        if zk is None:   # issue 52: topics with strata.remote.readreplica, served from a bucket
            from strata.tiered.bucket.read_replica import attach as attach_read_replicas
            attach_read_replicas(metadata, props, log_dirs[0]).listeners.append(
                watchers.notifier(loop))
        producer_ids = ProducerIdManager(log_dirs[0]) if zk is None else ProducerIdManager(
            log_dirs[0], allocate_block=lambda: (
                (b := zk.allocate_producer_id_block(node_id)).first_producer_id, b.size))
        authorizer = None
        if acls_enabled:   # ACLs in ZooKeeper (Kafka's /kafka-acl), or in the log dir alone
            from strata.cluster.acl_store import FileAclStore, ZkAclStore
            from strata.security.acl_authorizer import StandardAuthorizer
            authorizer = StandardAuthorizer.from_properties(
                props, ZkAclStore(zk) if zk is not None else FileAclStore(log_dirs[0])).start()
        from strata.cluster.delegation_tokens import (
            DelegationTokenManager, FileTokenStore, ZkTokenStore)
        delegation_tokens = DelegationTokenManager.from_properties(   # KIP-48; None when off
            props, lambda: ZkTokenStore(zk) if zk is not None else FileTokenStore(log_dirs[0]))
        if delegation_tokens is not None:
            delegation_tokens.start()
        client_quotas = ClientQuotaStore(log_dirs[0])
        quotas = ClientQuotaManager.from_properties(props)
        client_quotas.add_listener(quotas.on_quotas_changed)
        offsets_replicated = None   # one broker: coordinator writes are acks=1
        if zk is not None:
            from strata.server.purgatory import await_replication

            async def replicated(tp, required: int, timeout_s: float):
                errors = await await_replication(replica_manager, watchers, {0: (tp, required)}, timeout_s)
                return errors[0]
            offsets_replicated = replicated
        offsets_log = ReplicaOffsetsLog(replica_manager, metadata, props,
                                        await_replication=offsets_replicated)
        if zk is None:
            offsets_partitions = offsets_log.ensure_topic()
        else:  # made at the first FindCoordinator, once enough brokers are up (as Kafka does)
            existing = metadata.topic(OFFSETS_TOPIC)
            offsets_partitions = existing.partitions if existing else offsets_log.configured_partitions
        group_config = dataclasses.replace(GroupCoordinatorConfig.from_properties(props),
                                           offsets_topic_num_partitions=offsets_partitions)
        group_coordinator = GroupCoordinator(
            offsets_log, group_config, topic_exists=lambda topic: metadata.topic(topic) is not None,
            topics=metadata.topics)
        txn_log = ReplicaOffsetsLog.for_transaction_state(replica_manager, metadata, props,
                                                          await_replication=offsets_replicated)
        txn_marker_timeout_s = _int(props, "request.timeout.ms") / 1000
        markers = MarkerSender(node_id, metadata, LocalMarkerTarget(
            replica_manager, watchers, group_coordinator, txn_marker_timeout_s),
            security=inter_broker_security)
        from strata.cluster.features import FileFeatureStore, FinalizedFeatures, ZkFeatureStore
        features = FinalizedFeatures(   # transaction.version (UpdateFeatures)
            ZkFeatureStore(zk) if zk is not None else FileFeatureStore(log_dirs[0] / "features.json"))
        txn_coordinator = _transaction_coordinator(props, metadata, txn_log, producer_ids,
                                                   markers, loop, clustered=zk is not None,
                                                   features=features)
        # KIP-890: verification (optional), and the V2 add of a partition (always)
        txn_verifier = TxnVerifier(
            node_id, metadata, replica_manager, txn_coordinator, security=inter_broker_security,
            verification_enabled=_flag(props, "transaction.partition.verification.enable"))
        ctx = BrokerContext(node_id=node_id, advertised_host="", advertised_port=0, metadata=metadata,
                            inter_broker_security=inter_broker_security,
                            replica_manager=replica_manager, fetch_watchers=watchers,
                            auto_create_topics=_flag(props, "auto.create.topics.enable"),
                            producer_ids=producer_ids,
                            fetch_max_bytes=_int(props, "fetch.max.bytes"),
                            eligible_leader_replicas=_flag(props, "eligible.leader.replicas.enable"),
                            features=features,
                            fetch_sessions=FetchSessionCache.from_properties(props),   # KIP-227
                            authorizer=authorizer, delegation_tokens=delegation_tokens,
                            client_quotas=client_quotas, quotas=quotas, offsets_log=offsets_log,
                            group_coordinator=group_coordinator, txn_log=txn_log,
                            txn_coordinator=txn_coordinator, txn_verifier=txn_verifier,
                            txn_marker_timeout_s=txn_marker_timeout_s,
                            remote_fetch_max_wait_ms=tiering[1].remote_fetch_max_wait_ms
                            if rlm is not None else BrokerContext.remote_fetch_max_wait_ms,
                            failed_authentication_delay_ms=_int(
                                props, "connection.failed.authentication.delay.ms", 100))
        dir_failures = None
        if zk is None:
            # inside the loop (loaded members' session timers start once loaded), in the
            # background: the listener serves everything else meanwhile
            ctx.group_coordinator.load_in_background()
            if rlm is not None and rlm.manifests is not None:   # issue 52: cluster snapshots
                from strata.tiered.bucket.snapshot import start_snapshots
                start_snapshots(scheduler, props, rlm.manifests.catalog, metadata, ctx, loop)
        else:
            from strata.replication.replica_fetcher import ReplicaFetcherManager

            def endpoint_of(broker_id: int):
                found = next((b for b in metadata.live_brokers() if b.node_id == broker_id), None)
                return None if found is None else (found.host, found.port)
            guard = _tier_bootstrap_guard(props, manager, metadata)
            scheduler.schedule_periodic("tier-bootstrap-guard", guard.poll, 1000)
            fetchers = ReplicaFetcherManager.from_properties(
                node_id, props, endpoint_of, replica_manager.get_log,
                on_append=watchers.notifier(loop), quota=follower_quota, loop=loop,
                remote_aux_state=_guarded_aux_state(rlm, guard) if rlm is not None else None,
                security=inter_broker_security)
            fetchers_slot.set(fetchers)
            if rlm is not None:
                rlm.on_metadata_ready(fetchers.retry_now)
            follow = LeadershipPublisher(replica_manager, manager, metadata, loop,
                                         ctx.group_coordinator, remote_tier, ctx.txn_coordinator)
            metadata.add_listener(follow)
            follow.on_partition_states(metadata.hosted_states())  # what the first image said
            from strata.replication.log_dir_failure_handler import (
                DEFAULT_PROBE_INTERVAL_MS, PROBE_INTERVAL_CONFIG, LogDirFailureHandler)
            dir_failures = LogDirFailureHandler(   # offline replicas reported, and back
                manager.dir_failures, manager, replica_manager, metadata,
                probe_interval_ms=_int(props, PROBE_INTERVAL_CONFIG, DEFAULT_PROBE_INTERVAL_MS)).start()
        metadata.add_listener(ctx.group_coordinator)  # a deleted topic's offsets go with it
        if rlm is not None:
            rlm.start()
        metrics_server = start_metrics_server(props, manager, rlm, metadata)
        if metrics_server is not None:
            metrics_server.registry.register(ClientQuotaCollector(ctx.quotas))
            metrics_server.registry.register(AuthenticationCollector(ctx.authentication_stats))
            if cleaner is not None:
                metrics_server.registry.register(LogCleanerCollector(cleaner))
        from strata.net.tls import server_context
        from strata.common.listeners import listener_prop
        from strata.security.sasl import server_factories
        from strata.security.scram import BrokerCredentials
        dispatcher = Dispatcher(ctx)
        tls_props = metadata.effective_broker_props()   # keystores changed at runtime included
        # SCRAM logins: the stored credentials, and tokenauth against the delegation tokens
        credentials = BrokerCredentials(metadata.scram_credential, delegation_tokens)
        servers = [KafkaServer(dispatcher, listener.host or "0.0.0.0", listener.port,
                               max_request_size=_int(props, "socket.request.max.bytes"),
                               idle_timeout_ms=_int(props, "connections.max.idle.ms"),
                               sendfile=props.get(SENDFILE_PROP, "true").strip().lower() != "false",
                               send_buffer_bytes=_int(props, "socket.send.buffer.bytes"),
                               receive_buffer_bytes=_int(props, "socket.receive.buffer.bytes"),
                               listener=listener.name, security_protocol=listener.security_protocol,
                               ssl=server_context(tls_props, listener.name) if listener.tls else None,
                               sasl_factories=server_factories(props, listener.name, credentials)
                               if listener.sasl else None,
                               principal_rules=listener_prop(props, listener.name,
                                                             "ssl.principal.mapping.rules"),
                               sasl_max_receive_size=int(listener_prop(
                                   props, listener.name, "sasl.server.max.receive.size", "524288")))
                   for listener in listeners.listeners]
        if metrics_server is not None:   # Kafka's broker metrics (issue 48)
            from strata.log.flush_stats import LOG_FLUSH_STATS
            from strata.server.broker_metrics import EventLoopIdle
            from strata.server.metrics import KafkaBrokerCollector
            loop_idle = EventLoopIdle()
            loop_idle.install()   # on the event loop's thread, where `strata serve` builds
            metrics_server.registry.register(KafkaBrokerCollector(
                topic_stats=ctx.topic_stats, request_stats=dispatcher.request_metrics,
                replica_manager=replica_manager, metadata=metadata, servers=lambda: servers,
                watchers=watchers, loop_idle=loop_idle, flush_stats=LOG_FLUSH_STATS))
        from strata.server.tls_reload import ListenerTlsReloader
        tls_reloader = ListenerTlsReloader(metadata, servers, loop)
        metadata.broker_config_validator = tls_reloader.validate
        metadata.add_listener(tls_reloader)
        return cls(props=props, node_id=node_id, loop=loop, zk=zk,
                   leadership_lease=leadership_lease, listeners=listeners,
                   inter_broker_security=inter_broker_security, metadata=metadata,
                   scheduler=scheduler, manager=manager, cleaner=cleaner, watchers=watchers,
                   replica_manager=replica_manager, rlm=rlm, ctx=ctx, dir_failures=dir_failures,
                   metrics_server=metrics_server, servers=servers, stalls=STALLS,
                   alter_partition_slot=alter_partition_slot)

    @property
    def port(self) -> int:
        """The first listener's bound port."""
        return self.servers[0].port

    async def start(self) -> None:
        """Bind the listeners, advertise them, join the cluster (registration, controller,
        AlterPartition) and schedule the periodic tasks."""
        from strata.cluster.image import Endpoint
        props, zk, metadata, manager = self.props, self.zk, self.metadata, self.manager
        replica_manager, scheduler, node_id = self.replica_manager, self.scheduler, self.node_id
        for server in self.servers:
            await server.start()
        bound = {s.listener: s.port for s in self.servers}
        listeners = self.listeners
        # the inter-broker listener first: brokers' own connections take the first endpoint
        advertised = sorted(listeners.advertised,
                            key=lambda a: a.name != listeners.inter_broker_listener)
        endpoints = [Endpoint(a.name, a.host or socket.getfqdn(), a.port or bound[a.name],
                              a.security_protocol) for a in advertised]
        metadata.advertised_endpoints = {e.listener: (e.host, e.port) for e in endpoints}
        if zk is not None:
            from strata.cluster.controller import ControllerService, LoggingNoticeSink
            await asyncio.to_thread(_register, zk, metadata, node_id, tuple(endpoints),
                                    metadata.rack, all(manager.had_clean_shutdown.values()))
            rebalance = _flag(props, "auto.leader.rebalance.enable")
            self.controller = ControllerService(
                zk, node_id, LoggingNoticeSink(),
                unclean_leader_election_enable=_flag(
                    props, "unclean.leader.election.enable"),
                leader_imbalance_per_broker_percentage=_int(
                    props, "leader.imbalance.per.broker.percentage"),
                min_insync_replicas=_int(props, "min.insync.replicas"),
                eligible_leader_replicas_enable=_flag(props, "eligible.leader.replicas.enable"),
                auto_leader_rebalance_interval_s=_int(
                    props, "leader.imbalance.check.interval.seconds") if rebalance else None).start()
            metadata.controller = self.controller
            self.alter_partition_slot.set(_alter_partition_manager(
                node_id, metadata, self.leadership_lease, self.inter_broker_security))
        if zk is not None:  # Kafka's isr-expiration and highwatermark-checkpoint tasks
            scheduler.schedule_periodic("isr-expiration", replica_manager.shrink_isrs,
                                        replica_manager.replica_lag_time_max_ms // 2)
            scheduler.schedule_periodic("highwatermark-checkpoint",
                                        manager.checkpoint_high_watermarks,
                                        _int(props, "replica.high.watermark.checkpoint.interval.ms"))
        scheduler.schedule_periodic("log-retention", manager.cleanup_logs,
                                    _int(props, "log.retention.check.interval.ms"))
        scheduler.schedule_periodic("recovery-point-checkpoint", manager.checkpoint,
                                    _int(props, "log.flush.offset.checkpoint.interval.ms"))
        flush_interval = _int(props, "log.flush.scheduler.interval.ms")
        if flush_interval < 2**62:
            scheduler.schedule_periodic("log-flusher", manager.flush_dirty_logs, flush_interval)
        scheduler.schedule_periodic("producer-expiration",
                                    lambda: [ul.remove_expired_producers() for ul in manager.all_logs()],
                                    _int(props, "producer.id.expiration.check.interval.ms"))
        log.info("broker %d up: cluster %s, listening on %s, advertised %s, %d partition logs",
                 node_id, metadata.cluster_id,
                 ", ".join(f"{s.host}:{s.port} ({s.listener})" for s in self.servers),
                 ", ".join(f"{e.host}:{e.port} ({e.listener})" for e in endpoints),
                 len(manager.partitions()))

    async def serve(self, stop: asyncio.Event, started=None) -> None:
        """Start, call ``started(port)``, serve until ``stop`` is set, shut down."""
        await self.start()
        if started is not None:
            started(self.port)
        await stop.wait()
        await self.shutdown()

    async def shutdown(self) -> None:
        """No new connections, in-flight requests finished, every part closed in order."""
        log.info("shutting down: no new connections, finishing in-flight requests")
        props, zk, metadata, ctx = self.props, self.zk, self.metadata, self.ctx
        replica_manager = self.replica_manager
        # first, so that parked JoinGroup/SyncGroup requests are answered (NOT_COORDINATOR) at
        # once instead of holding the server's grace period
        if zk is not None:
            if _flag(props, "controlled.shutdown.enable"):
                drained = await asyncio.to_thread(metadata.controlled_shutdown,
                                                  CONTROLLED_SHUTDOWN_WAIT_S)
                log.info("controlled shutdown: %s", "leaderships moved" if drained
                         else f"not drained after {CONTROLLED_SHUTDOWN_WAIT_S} s; stopping anyway")
            # Leaving ZooKeeper hands whatever this broker still leads to the others at once.
            if self.dir_failures is not None:
                self.dir_failures.close()
            if replica_manager.fetchers is not None:   # its tasks run on this loop until they end
                await asyncio.to_thread(replica_manager.fetchers.shutdown)
            if replica_manager.alter_partition is not None:
                replica_manager.alter_partition.shutdown()
            if self.controller is not None:
                self.controller.close()
            # the view's thread stops (waited for): no listener touches a log after this
            await asyncio.to_thread(metadata.close)
            if ctx.authorizer is not None:
                await asyncio.to_thread(ctx.authorizer.close)
            if ctx.delegation_tokens is not None:
                await asyncio.to_thread(ctx.delegation_tokens.close)
            zk.close()
        ctx.group_coordinator.shutdown()
        ctx.txn_coordinator.shutdown()
        ctx.txn_coordinator.markers.close()
        if ctx.txn_verifier is not None:
            ctx.txn_verifier.close()
        self.watchers.close()  # long-polling fetches answer now
        for server in self.servers:
            await server.stop()
        if zk is None:  # an admin change under way finishes; listeners hear nothing more
            await asyncio.to_thread(metadata.close)
            metadata.read_replicas.close()   # NO_READ_REPLICAS's does nothing
        if self.metrics_server is not None:
            self.metrics_server.stop()
        if self.rlm is not None:
            self.rlm.shutdown()
        self.scheduler.shutdown(run_pending=False)
        if self.cleaner is not None:
            self.cleaner.shutdown()
        self.manager.shutdown()
        self.stalls.close()
        log.info("clean shutdown complete")

