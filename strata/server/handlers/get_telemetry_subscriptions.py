"""GetTelemetrySubscriptions v0 (KIP-714): no client-metrics subscription exists here, so every
client gets an empty metrics list (and so never pushes), with Kafka's defaults otherwise.

A client without an instance id (null or zero) gets a new one. The subscription id is Kafka's:
CRC-32C of the metric list and push interval, XOR the instance id's Java hash, so PushTelemetry
can check it without state. Kafka's per-client throttling of early requests is not kept.
"""

from __future__ import annotations

import datetime
import uuid

import crc32c

from strata.cluster.metadata import ZERO_UUID, random_kafka_uuid
from strata.protocol.codec import make, response_class

PUSH_INTERVAL_MS = 300_000          # ClientMetricsConfigs.DEFAULT_INTERVAL_MS
TELEMETRY_MAX_BYTES = 1_048_576     # telemetry.max.bytes default
ACCEPTED_COMPRESSION_TYPES = (4, 3, 1, 2)  # zstd, lz4, gzip, snappy: Kafka's order
REQUESTED_METRICS: tuple[str, ...] = ()


def _int32(x: int) -> int:
    x &= 0xFFFFFFFF
    return x - (1 << 32) if x >= 1 << 31 else x


def java_uuid_hash(u: uuid.UUID) -> int:
    """Kafka's ``Uuid.hashCode``."""
    h = (u.int >> 64) ^ (u.int & 0xFFFFFFFFFFFFFFFF)
    return _int32((h >> 32) ^ h)


def subscription_id(client_instance_id: uuid.UUID) -> int:
    """Kafka's ``computeSubscriptionId`` for the (empty) metric list and the push interval."""
    listed = "[" + ", ".join(REQUESTED_METRICS) + "]"
    crc = crc32c.crc32c(f"{listed}{PUSH_INTERVAL_MS}".encode())
    return _int32(crc ^ java_uuid_hash(client_instance_id))


async def handle(ctx, request):
    rc = response_class(request.api_key, request.api_version)
    instance_id = request.body.client_instance_id
    if instance_id is None or instance_id == ZERO_UUID:
        instance_id = random_kafka_uuid()
    return make(rc, client_instance_id=instance_id, subscription_id=subscription_id(instance_id),
                accepted_compression_types=ACCEPTED_COMPRESSION_TYPES,
                push_interval=datetime.timedelta(milliseconds=PUSH_INTERVAL_MS),
                telemetry_max_bytes=TELEMETRY_MAX_BYTES, delta_temporality=True,
                requested_metrics=REQUESTED_METRICS)
