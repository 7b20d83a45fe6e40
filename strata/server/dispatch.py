"""Requests to handlers by API key; the advertised versions are those with a handler."""

from __future__ import annotations

import logging

from strata.common.errors import ErrorCode, KafkaError
from strata.protocol.codec import API_VERSIONS, ApiKey, DecodedRequest, error_response
from strata.server.handlers import (
    add_offsets_to_txn, add_partitions_to_txn, end_txn, txn_offset_commit, write_txn_markers,
    alter_client_quotas, alter_configs, alter_partition, alter_partition_reassignments,
    api_versions, create_acls, create_partitions, create_topics, delete_acls, delete_groups,
    delete_records, delete_topics,
    describe_acls, describe_client_quotas, describe_cluster, describe_configs, describe_groups,
    describe_log_dirs, describe_producers, describe_topic_partitions, describe_transactions,
    describe_user_scram_credentials, elect_leaders, fetch, find_coordinator,
    get_telemetry_subscriptions, heartbeat, init_producer_id, join_group, leave_group,
    list_groups, list_offsets, list_partition_reassignments, list_transactions, metadata,
    offset_commit, offset_delete, offset_fetch, offset_for_leader_epoch, produce, push_telemetry,
    sasl_authenticate, sasl_handshake, sync_group)
from strata.server.handlers import alter_user_scram_credentials, delegation_tokens
from strata.server.handlers import consumer_group_describe, consumer_group_heartbeat
from strata.server.handlers import update_features
from strata.security.authorizer import CURRENT_REQUEST
from strata.server.handlers.group_common import CURRENT_CONNECTION
from strata.server.network import CloseConnection
from strata.server.broker_metrics import RequestStats

log = logging.getLogger(__name__)

HANDLERS = {
    ApiKey.API_VERSIONS: api_versions.handle,
    ApiKey.METADATA: metadata.handle,
    ApiKey.PRODUCE: produce.handle,
    ApiKey.FETCH: fetch.handle,
    ApiKey.LIST_OFFSETS: list_offsets.handle,
    ApiKey.INIT_PRODUCER_ID: init_producer_id.handle,
    ApiKey.ADD_PARTITIONS_TO_TXN: add_partitions_to_txn.handle,
    ApiKey.ADD_OFFSETS_TO_TXN: add_offsets_to_txn.handle,
    ApiKey.END_TXN: end_txn.handle,
    ApiKey.WRITE_TXN_MARKERS: write_txn_markers.handle,
    ApiKey.TXN_OFFSET_COMMIT: txn_offset_commit.handle,
    ApiKey.FIND_COORDINATOR: find_coordinator.handle,
    ApiKey.JOIN_GROUP: join_group.handle,
    ApiKey.SYNC_GROUP: sync_group.handle,
    ApiKey.HEARTBEAT: heartbeat.handle,
    ApiKey.LEAVE_GROUP: leave_group.handle,
    ApiKey.OFFSET_COMMIT: offset_commit.handle,
    ApiKey.OFFSET_FETCH: offset_fetch.handle,
    ApiKey.DESCRIBE_GROUPS: describe_groups.handle,
    ApiKey.CONSUMER_GROUP_HEARTBEAT: consumer_group_heartbeat.handle,
    ApiKey.CONSUMER_GROUP_DESCRIBE: consumer_group_describe.handle,
    ApiKey.LIST_GROUPS: list_groups.handle,
    ApiKey.DELETE_GROUPS: delete_groups.handle,
    ApiKey.OFFSET_DELETE: offset_delete.handle,
    ApiKey.CREATE_TOPICS: create_topics.handle,
    ApiKey.DELETE_TOPICS: delete_topics.handle,
    ApiKey.CREATE_PARTITIONS: create_partitions.handle,
    ApiKey.DELETE_RECORDS: delete_records.handle,
    ApiKey.DESCRIBE_CONFIGS: describe_configs.handle,
    ApiKey.ALTER_CONFIGS: alter_configs.handle,
    ApiKey.INCREMENTAL_ALTER_CONFIGS: alter_configs.handle,
    ApiKey.DESCRIBE_CLUSTER: describe_cluster.handle,
    ApiKey.UPDATE_FEATURES: update_features.handle,
    ApiKey.DESCRIBE_LOG_DIRS: describe_log_dirs.handle,
    ApiKey.DESCRIBE_CLIENT_QUOTAS: describe_client_quotas.handle,
    ApiKey.ALTER_CLIENT_QUOTAS: alter_client_quotas.handle,
    ApiKey.OFFSET_FOR_LEADER_EPOCH: offset_for_leader_epoch.handle,
    ApiKey.DESCRIBE_ACLS: describe_acls.handle,
    ApiKey.CREATE_ACLS: create_acls.handle,
    ApiKey.DELETE_ACLS: delete_acls.handle,
    ApiKey.DESCRIBE_PRODUCERS: describe_producers.handle,
    ApiKey.LIST_TRANSACTIONS: list_transactions.handle,
    ApiKey.DESCRIBE_TRANSACTIONS: describe_transactions.handle,
    ApiKey.ELECT_LEADERS: elect_leaders.handle,
    ApiKey.LIST_PARTITION_REASSIGNMENTS: list_partition_reassignments.handle,
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: alter_partition_reassignments.handle,
    ApiKey.ALTER_PARTITION: alter_partition.handle,
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: describe_user_scram_credentials.handle,
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: alter_user_scram_credentials.handle,
    ApiKey.SASL_HANDSHAKE: sasl_handshake.handle,
    ApiKey.SASL_AUTHENTICATE: sasl_authenticate.handle,
    ApiKey.DESCRIBE_TOPIC_PARTITIONS: describe_topic_partitions.handle,
    ApiKey.GET_TELEMETRY_SUBSCRIPTIONS: get_telemetry_subscriptions.handle,
    ApiKey.PUSH_TELEMETRY: push_telemetry.handle,
    ApiKey.CREATE_DELEGATION_TOKEN: delegation_tokens.handle_create,
    ApiKey.RENEW_DELEGATION_TOKEN: delegation_tokens.handle_renew,
    ApiKey.EXPIRE_DELEGATION_TOKEN: delegation_tokens.handle_expire,
    ApiKey.DESCRIBE_DELEGATION_TOKEN: delegation_tokens.handle_describe,
}


def advertised_versions() -> dict[int, tuple[int, int]]:
    return {k: v for k, v in API_VERSIONS.items() if k in HANDLERS}


class Dispatcher:
    """The network layer's handler: one call per request, errors become Kafka error codes."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.request_metrics = RequestStats()   # counted by the network layer (KafkaServer)

    async def __call__(self, request: DecodedRequest, conn):
        handler = HANDLERS.get(request.api_key)
        if handler is None:
            return error_response(request, ErrorCode.UNSUPPORTED_VERSION)
        session = conn.sasl
        if session is not None and (refused := session.refusal(request.api_key)) is not None:
            if session.expired():
                self.ctx.authentication_stats.expired_killed(conn.listener)
            raise CloseConnection(refused)
        token = CURRENT_CONNECTION.set(conn)
        api_token = CURRENT_REQUEST.set(request.api_key)
        try:
            quotas = self.ctx.quotas
            if quotas is not None and quotas.any_enabled:
                return await quotas.enforce(request, conn, lambda r: self._handle(handler, r))
            return await self._handle(handler, request)
        finally:
            CURRENT_REQUEST.reset(api_token)
            CURRENT_CONNECTION.reset(token)

    async def sasl_token(self, token: bytes, conn) -> bytes:
        """A raw SASL token after SaslHandshake v0 (network.py); raises CloseConnection when
        the exchange fails or cannot go on."""
        try:
            return await sasl_authenticate.raw_token(self.ctx, conn, token)
        except CloseConnection:
            raise
        except Exception as exc:  # noqa: BLE001 - a broken token closes its connection only
            log.exception("raw SASL token from %s failed", conn.peer)
            raise CloseConnection(f"SASL token could not be processed: {exc}") from None

    async def _handle(self, handler, request: DecodedRequest):
        try:
            return await handler(self.ctx, request)
        except KafkaError as exc:
            return error_response(request, exc.code, str(exc))
        except CloseConnection:   # the handler's answer is to close the connection
            raise
        except Exception:  # noqa: BLE001 - a handler bug answers this request, never kills the broker
            log.exception("%s v%d failed", request.api_key.name, request.api_version)
            return error_response(request, ErrorCode.UNKNOWN_SERVER_ERROR)
