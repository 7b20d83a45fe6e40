"""Kafka's znode JSON (ZkData): what older and current Kafka brokers wrote decodes, and the
``zookeeper.*`` configs parse as Kafka's do."""

from __future__ import annotations

import uuid
from dataclasses import replace

import pytest

from strata.cluster.image import (
    NO_LEADER, BrokerDirectories, BrokerRegistration, Endpoint, LeaderRecoveryState,
    PartitionRegistration)
from strata.cluster.zk import znodes as z
from strata.cluster.zk.config import ZkClientConfig
from strata.common.types import uuid_to_kafka_str


def test_a_version_4_broker_registration_from_kafka_decodes():
    data = (b'{"listener_security_protocol_map":{"CLIENT":"SASL_SSL","REPLICATION":"PLAINTEXT"},'
            b'"endpoints":["CLIENT://host1:9092","REPLICATION://host1:9093"],"rack":"dc1",'
            b'"jmx_port":9999,"host":null,"timestamp":"2233345666","port":-1,"version":4}')
    assert z.decode_broker(4, data, epoch=77) == BrokerRegistration(4, "dc1", (
        Endpoint("CLIENT", "host1", 9092, "SASL_SSL"),
        Endpoint("REPLICATION", "host1", 9093, "PLAINTEXT")), epoch=77)


def test_old_broker_registrations_take_the_protocol_from_the_listener_name():
    v1 = b'{"version":1,"host":"localhost","port":9092,"jmx_port":9999,"timestamp":"2233345666"}'
    v2 = (b'{"version":2,"host":"localhost","port":9092,"jmx_port":9999,"timestamp":"1",'
          b'"endpoints":["PLAINTEXT://host1:9092","SSL://host1:9093"]}')
    assert z.decode_broker(1, v1, 5).endpoints == (Endpoint("PLAINTEXT", "localhost", 9092),)
    assert z.decode_broker(2, v2, 5).endpoints == (
        Endpoint("PLAINTEXT", "host1", 9092), Endpoint("SSL", "host1", 9093, "SSL"))


def test_a_broker_without_a_plaintext_listener_registers_a_null_host_and_ipv6_is_bracketed():
    reg = BrokerRegistration(1, None, (Endpoint("INTERNAL", "::1", 9094, "SSL"),), epoch=3)
    data = z.encode_broker(reg, timestamp_ms=5)
    assert data == (b'{"version":5,"host":null,"port":-1,"endpoints":["INTERNAL://[::1]:9094"],'
                    b'"jmx_port":-1,"timestamp":"5",'
                    b'"listener_security_protocol_map":{"INTERNAL":"SSL"},"features":{}}')
    assert z.decode_broker(1, data, 3) == reg


def test_a_registration_says_its_directories_and_an_unclean_shutdown_in_fields_kafka_skips():
    directory = uuid.UUID(int=42)
    reg = BrokerRegistration(1, None, (Endpoint("PLAINTEXT", "h", 9092),), epoch=3,
                             directory_ids=(directory,), clean_shutdown=False)
    data = z.encode_broker(reg, timestamp_ms=5)
    assert data == (b'{"version":5,"host":"h","port":9092,"endpoints":["PLAINTEXT://h:9092"],'
                    b'"jmx_port":-1,"timestamp":"5",'
                    b'"listener_security_protocol_map":{"PLAINTEXT":"PLAINTEXT"},"features":{},'
                    b'"directory_ids":["' + uuid_to_kafka_str(directory).encode() + b'"],'
                    b'"clean_shutdown":false}')
    assert z.decode_broker(1, data, 3) == reg
    clean = replace(reg, clean_shutdown=True)
    assert b"clean_shutdown" not in z.encode_broker(clean)
    assert z.decode_broker(1, z.encode_broker(clean), 3) == clean


def test_a_kafka_registration_reads_as_no_directory_known_and_a_clean_shutdown():
    data = (b'{"version":5,"host":"h","port":9092,"endpoints":["PLAINTEXT://h:9092"],'
            b'"jmx_port":-1,"timestamp":"5","listener_security_protocol_map":'
            b'{"PLAINTEXT":"PLAINTEXT"},"features":{}}')
    reg = z.decode_broker(1, data, 3)
    assert (reg.directory_ids, reg.clean_shutdown) == ((), True)


def test_the_controllers_record_of_a_registration_round_trips():
    value = BrokerDirectories((uuid.UUID(int=1), uuid.UUID(int=2)), 4294967312)
    assert z.decode_broker_directories(z.encode_broker_directories(value)) == value
    assert z.broker_directories_path(3) == "/strata/broker_directories/3"
    with pytest.raises(ValueError):
        z.decode_broker_directories(b'{"version":2,"directory_ids":[],"broker_epoch":1}')


def test_partition_state_round_trips_and_recovery_state_is_written_only_while_recovering():
    recovered = PartitionRegistration(1, (1, 2), leader_epoch=3, partition_epoch=8, controller_epoch=2)
    recovering = PartitionRegistration(NO_LEADER, (2,),
                                       leader_epoch=4, partition_epoch=9, controller_epoch=2,
                                       leader_recovery_state=LeaderRecoveryState.RECOVERING)
    assert b"leader_recovery_state" not in z.encode_partition_state(recovered)
    assert b'"leader_recovery_state":1' in z.encode_partition_state(recovering)
    for state in (recovered, recovering):
        assert z.decode_partition_state(z.encode_partition_state(state), state.partition_epoch) == state


def test_a_topic_written_before_topic_ids_and_reassignments_decodes():
    old = z.TopicAssignment.decode("t", b'{"version":1,"partitions":{"0":[1,2],"1":[2,1]}}', 4)
    assert old == z.TopicAssignment("t", None, {0: z.ReplicaAssignment((1, 2)),
                                                1: z.ReplicaAssignment((2, 1))}, 4)
    assert b"topic_id" not in old.encode()
    topic_id = uuid.uuid4()
    new = z.TopicAssignment("t", topic_id, {0: z.ReplicaAssignment((1, 2), (2,), (3,))})
    assert z.TopicAssignment.decode("t", new.encode()) == new
    assert uuid_to_kafka_str(topic_id).encode() in new.encode()


def test_config_znodes_decode_and_a_znode_without_data_reads_as_no_config():
    assert z.decode_entity_config(b'{"version":1,"config":{"cleanup.policy":"compact"}}') == \
        {"cleanup.policy": "compact"}
    assert z.decode_entity_config(b"") == {}
    assert z.decode_config_change(z.encode_config_change("brokers/<default>")) == "brokers/<default>"


def test_producer_id_block_and_cluster_id_round_trip():
    block = z.ProducerIdsBlock(2, 1000, 1000)
    assert (block.last_producer_id, block.next_block_first_id) == (1999, 2000)
    assert z.ProducerIdsBlock.decode(block.encode()) == block
    assert z.decode_cluster_id(z.encode_cluster_id("abc")) == "abc"
    assert z.ControllerRegistration.decode(z.ControllerRegistration(3, 9).encode(), 2) == \
        z.ControllerRegistration(3, 9, -1, 2)


@pytest.mark.parametrize("connect, hosts, chroot", [
    ("127.0.0.1:2181", "127.0.0.1:2181", None),
    ("a:1,b:2/kafka", "a:1,b:2", "/kafka"),
    ("a:1/strata/one/", "a:1", "/strata/one"),
    ("a:1/", "a:1", None),
])
def test_the_connect_string_splits_into_servers_and_chroot(connect, hosts, chroot):
    config = ZkClientConfig(connect)
    assert (config.hosts, config.chroot) == (hosts, chroot)


def test_zookeeper_configs_use_kafkas_names_and_defaults():
    assert ZkClientConfig.from_properties({}) is None
    config = ZkClientConfig.from_properties({"zookeeper.connect": "h:1/c"})
    assert (config.session_timeout_ms, config.effective_connection_timeout_ms) == (18000, 18000)
    config = ZkClientConfig.from_properties({"zookeeper.connect": "h:1",
                                             "zookeeper.session.timeout.ms": "6000",
                                             "zookeeper.connection.timeout.ms": "2000"})
    assert (config.session_timeout_ms, config.effective_connection_timeout_ms) == (6000, 2000)


def test_log_dir_event_notifications_and_offline_replicas_round_trip():
    from strata.common.types import TopicPartition
    assert z.encode_log_dir_event(2) == b'{"version":1,"broker":2,"event":1}'   # Kafka's
    assert z.decode_log_dir_event(z.encode_log_dir_event(2, z.LOG_DIR_RECOVERY_EVENT)) == 2
    parts = frozenset({TopicPartition("t", 2), TopicPartition("t", 0), TopicPartition("u", 1)})
    data = z.encode_replica_report(4294967312, parts)
    assert data == b'{"version":1,"broker_epoch":4294967312,"partitions":{"t":[0,2],"u":[1]}}'
    assert z.decode_replica_report(data) == (4294967312, parts)
    assert z.replica_report_path(z.OFFLINE_REPLICAS_PATH, 3) == "/strata/offline_replicas/3"
    assert z.replica_report_path(z.TIER_BOOTSTRAPPED_PATH, 3) == "/strata/tier_bootstrapped/3"
