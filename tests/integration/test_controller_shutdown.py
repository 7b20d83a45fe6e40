"""A clean shutdown of the broker that is the controller, under traffic, keeps its replicas
(issue 51, part 3): three ``strata serve`` processes and a real ZooKeeper, RF 3 topics with
acks=all producers running while the controller is stopped with SIGTERM. It resigns, its view
of the cluster closes and its log manager closes its logs; no partition directory of a live
topic may be renamed ``-delete``, it must log its clean shutdown, and after a restart it holds
every acknowledged record again."""

from __future__ import annotations

import collections
import re
import threading

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import (
    AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic, ResourceType)
from zk_server import zookeeper_available

from cluster_clients import NO_TIERING, admin, consume_all, log_end, partitions, wait_for
from cluster_process import StrataCluster, metadata_node_ids
from strata.log.log_manager import CLEAN_SHUTDOWN_FILE, DELETE_DIR_SUFFIX

_ok, _why = zookeeper_available()
pytestmark = pytest.mark.skipif(not _ok, reason=_why)

TOPICS = [f"live-{i}" for i in range(6)]
PARTITIONS = 8   # 48 replicas of live topics on every broker
OVERRIDES = {
    "zookeeper.session.timeout.ms": "6000",
    **NO_TIERING,
    "offsets.topic.num.partitions": "3",
    "replica.fetch.wait.max.ms": "100",
}


class Traffic:
    """acks=all idempotent producers writing to every partition until stopped; what was
    acknowledged, by (topic, partition)."""

    def __init__(self, bootstrap: str):
        self.acked: dict[tuple[str, int], list[bytes]] = collections.defaultdict(list)
        self._producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                                   "enable.idempotence": True, "linger.ms": 5,
                                   "message.timeout.ms": 60000, "metadata.max.age.ms": 1000})
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._n = 0

    def _report(self, err, msg) -> None:
        if err is None:
            self.acked[(msg.topic(), msg.partition())].append(msg.key())

    def _run(self) -> None:
        while not self._stop.is_set():
            for topic in TOPICS:
                for p in range(PARTITIONS):
                    key = b"%s-%d-%d" % (topic.encode(), p, self._n)
                    self._producer.produce(topic, key=key, value=key, partition=p,
                                           on_delivery=self._report)
            self._n += 1
            self._producer.poll(0.02)

    def start(self) -> "Traffic":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        assert self._producer.flush(60) == 0


class ConfigChurn:
    """Changes a topic config over and over through ``bootstrap``: every broker's view of
    ZooKeeper keeps rebuilding images while the controller shuts down."""

    def __init__(self, bootstrap: str, topic: str):
        self._admin = admin(bootstrap)
        self._topic = topic
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.changes = 0

    def _run(self) -> None:
        while not self._stop.is_set():
            entry = ConfigEntry("retention.ms", str(3_600_000 + self.changes),
                                incremental_operation=AlterConfigOpType.SET)
            resource = ConfigResource(ResourceType.TOPIC, self._topic, incremental_configs=[entry])
            try:
                self._admin.incremental_alter_configs([resource])[resource].result(10)
                self.changes += 1
            except Exception:  # noqa: BLE001 - brokers come and go
                pass

    def start(self) -> "ConfigChurn":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)


def test_the_controller_stopped_cleanly_under_traffic_deletes_no_replica_and_keeps_its_data(
        tmp_path):
    with StrataCluster(tmp_path, brokers=3, overrides=OVERRIDES) as cluster:
        futures = admin(cluster.bootstrap).create_topics(
            [NewTopic(t, PARTITIONS, 3, config={"min.insync.replicas": "2"}) for t in TOPICS])
        for f in futures.values():
            f.result(30)
        for t in TOPICS:
            wait_for(f"{t} has leaders", lambda t=t: all(
                m.leader >= 0 for m in partitions(cluster.bootstrap, t).values()))
        _, controller_id = metadata_node_ids(cluster.brokers[0].bootstrap)
        controller = cluster.broker(controller_id)
        other = next(b for b in cluster.brokers if b.node_id != controller_id)
        traffic = Traffic(cluster.bootstrap).start()
        wait_for("records acknowledged on every partition",
                 lambda: len(traffic.acked) == len(TOPICS) * PARTITIONS
                 and min(len(k) for k in traffic.acked.values()) >= 20)

        churns = [ConfigChurn(other.bootstrap, t).start() for t in TOPICS[-2:]]
        wait_for("config changes under way", lambda: min(c.changes for c in churns) >= 5)
        assert controller.stop() == 0
        for churn in churns:
            churn.stop()
        output = controller.output()
        assert "resigns as controller" in output
        assert "clean shutdown complete" in output
        assert (controller.log_dir / CLEAN_SHUTDOWN_FILE).exists()
        assert [d.name for d in controller.log_dir.iterdir()
                if d.name.endswith(DELETE_DIR_SUFFIX)] == []
        assert re.search(r"topic \S+ \(\S+\) deleted|not deleting the log", output) is None
        hosted = {d.name for d in controller.log_dir.iterdir() if d.is_dir()}
        assert {f"{t}-{p}" for t in TOPICS for p in range(PARTITIONS)} <= hosted

        controller.start()
        cluster.wait_metadata()
        traffic.stop()
        loaded = re.findall(r"loaded \d+ logs from \S+ \((.*)\)", controller.output())
        assert loaded[-1] == "clean shutdown"
        for t in TOPICS:
            wait_for(f"{t}'s ISRs whole again", lambda t=t: all(
                len(m.isr) == 3 for m in partitions(cluster.bootstrap, t).values()))
        for (t, p), keys in sorted(traffic.acked.items()):
            assert log_end(controller, t, p) >= len(keys), (t, p)
        # read back from the cluster: every acknowledged record of one topic, in order
        for p in range(PARTITIONS):
            keys = traffic.acked[(TOPICS[0], p)]
            got = consume_all(cluster.bootstrap, TOPICS[0], len(keys), partition=p)
            assert [k for k in got if k in set(keys)] == keys
