"""The transaction coordinator's marker channel (Kafka's TransactionMarkerChannelManager):
a marker goes to each of its partitions' leaders, by ``write_markers`` for those this broker
leads and by a WriteTxnMarkers request (v1, v2 for a V2 transaction's markers) (``BrokerChannel``) for the others. A partition with no live leader answers
NOT_LEADER_OR_FOLLOWER and one whose topic is gone UNKNOWN_TOPIC_OR_PARTITION: the coordinator
retries the first and drops the second."""

from __future__ import annotations

import asyncio
import logging

from strata.common.errors import ErrorCode, error_code_of
from strata.coordinator.txn_coordinator import TxnMarker
from strata.protocol.codec import ApiKey, make, request_class, response_class
from strata.server.broker_channel import BrokerChannel
from strata.server.txn_markers import MarkerTarget, write_markers

log = logging.getLogger(__name__)

WRITE_TXN_MARKERS_VERSION = 1
V2_MARKERS_VERSION = 2    # carries the marker's transaction version (a V2 transaction's)

TopicPartition = tuple[str, int]


class MarkerSender:
    """Markers for partitions this broker leads are written to ``local`` (``write_markers``);
    ``metadata`` says who leads the others."""

    def __init__(self, node_id: int, metadata, local: MarkerTarget, *, security=None,
                 channel: BrokerChannel | None = None):
        self.node_id = node_id
        self.metadata = metadata
        self.local = local
        self.channel = channel or BrokerChannel(f"broker-{node_id}-txn-marker-sender",
                                                security=security)
        self._classes = {v: (request_class(ApiKey.WRITE_TXN_MARKERS, v),
                             response_class(ApiKey.WRITE_TXN_MARKERS, v))
                         for v in (WRITE_TXN_MARKERS_VERSION, V2_MARKERS_VERSION)}

    async def send(self, marker: TxnMarker) -> dict[TopicPartition, ErrorCode]:
        metadata = self.metadata
        results: dict[TopicPartition, ErrorCode] = {}
        by_leader: dict[int, list[TopicPartition]] = {}
        live = {b.node_id: b for b in metadata.live_brokers()}
        for tp in marker.partitions:
            if metadata.topic(tp[0]) is None:
                results[tp] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                continue
            st = metadata.partition_state(*tp)
            leader = -1 if st is None else st.leader
            if leader not in live and leader != self.node_id:
                results[tp] = ErrorCode.NOT_LEADER_OR_FOLLOWER
                continue
            by_leader.setdefault(leader, []).append(tp)
        jobs = []
        for leader, parts in by_leader.items():
            part = TxnMarker(marker.producer_id, marker.producer_epoch, marker.commit,
                             marker.coordinator_epoch, tuple(parts), marker.transaction_version)
            if leader == self.node_id:
                jobs.append(self._local(part))
            else:
                b = live[leader]
                jobs.append(asyncio.to_thread(self._remote, leader, b.host, b.port, part))
        for answer in await asyncio.gather(*jobs):
            results.update(answer)
        return results

    async def _local(self, marker: TxnMarker) -> dict[TopicPartition, ErrorCode]:
        (answer,) = await write_markers(self.local, [marker])
        return {tuple(tp): code for tp, code in answer.items()}

    def _remote(self, broker: int, host: str, port: int,
                marker: TxnMarker) -> dict[TopicPartition, ErrorCode]:
        by_topic: dict[str, list[int]] = {}
        for topic, p in marker.partitions:
            by_topic.setdefault(topic, []).append(p)
        rq, rs = self._classes[V2_MARKERS_VERSION if marker.transaction_version >= 2
                               else WRITE_TXN_MARKERS_VERSION]
        body = rq(markers=(make(rq, "markers", producer_id=marker.producer_id,
                                producer_epoch=marker.producer_epoch,
                                transaction_result=marker.commit,
                                coordinator_epoch=marker.coordinator_epoch,
                                transaction_version=marker.transaction_version,
                                topics=tuple(make(rq, "markers.topics", name=t,
                                                  partition_indexes=tuple(ps))
                                             for t, ps in by_topic.items())),))
        try:
            response = self.channel.request(host, port, body, rs)
        except Exception as exc:  # noqa: BLE001 - the coordinator retries
            log.info("WriteTxnMarkers to broker %d failed: %s", broker, exc)
            return {tp: ErrorCode.NETWORK_EXCEPTION for tp in marker.partitions}
        out: dict[TopicPartition, ErrorCode] = {}
        for m in response.markers:
            for t in m.topics:
                for p in t.partitions:
                    out[(t.name, p.partition_index)] = error_code_of(p.error_code)
        return out

    def close(self) -> None:
        self.channel.close()
