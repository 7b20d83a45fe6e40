"""Committed offsets and group administration against a live Strata broker, through
confluent-kafka and Kafka 4.4's ``kafka-consumer-groups``: a deleted topic's offsets go with it
(also across a restart), and DeleteGroups / OffsetDelete behave as Kafka's do.

The ``kafka-consumer-groups`` tests need the Kafka jars (``make kafka-dist``) and skip with
the reason without them; the confluent-kafka tests always run.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from broker_process import BrokerProcess, free_port
from kafka_tools import (
    CONSUMER_GROUPS, require_kafka_dist, kafka_java_command, kafka_libs, run_kafka_class)
from support.waiting import eventually
from test_consumer_groups import (
    NO_DELAY, as_records, assert_clean_log, committed, consumer, make_records, poll_messages,
    produce)

pytestmark = pytest.mark.slow

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

OFFSET_INVALID = -1001  # librdkafka's "no committed offset"


@pytest.fixture
def kafka_tools():
    require_kafka_dist()


def admin(b: BrokerProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": b.bootstrap})


def create_topic(b: BrokerProcess, topic: str, partitions: int = 1) -> None:
    a = admin(b)  # referenced until the result is in
    a.create_topics([NewTopic(topic, partitions)])[topic].result(30)


def delete_topic(b: BrokerProcess, topic: str) -> None:
    a = admin(b)
    a.delete_topics([topic])[topic].result(30)


def consume_and_commit(b: BrokerProcess, group: str, topic: str, count: int,
                       commit_offset: int | None = None) -> list:
    """Read ``count`` records of ``topic`` in ``group``; commit ``commit_offset`` (default:
    the position after them), then leave the group."""
    c = consumer(b.bootstrap, group)
    try:
        c.subscribe([topic])
        got = poll_messages(c, count)
        if commit_offset is None:
            c.commit(asynchronous=False)
        else:
            c.commit(offsets=[ck.TopicPartition(topic, 0, commit_offset)], asynchronous=False)
        return got
    finally:
        c.close()


def consumer_groups(b: BrokerProcess, *args: str) -> str:
    """``kafka-consumer-groups`` output (stdout and stderr; it prints errors to stdout)."""
    result = run_kafka_class(CONSUMER_GROUPS, "--bootstrap-server", b.bootstrap, *args)
    return result.stdout + result.stderr


@pytest.mark.parametrize("restart", [None, "after-recreation", "killed-between"])
def test_group_resumes_a_recreated_topic_from_its_start_not_the_old_offset(tmp_path, restart):
    """A group committed 50 on "t"; "t" is deleted and created again with 80 new records: the
    group reads all 80 (the old offset would skip 50 of them), also when the broker restarts
    after the recreation, or is killed between the deletion and the recreation."""
    b = BrokerProcess(tmp_path, overrides=NO_DELAY).start()
    try:
        create_topic(b, "t")
        produce(b.bootstrap, "t", make_records(60, tag="old"))
        consume_and_commit(b, "resumers", "t", 60, commit_offset=50)

        delete_topic(b, "t")
        if restart == "killed-between":
            b.stop(signal.SIGKILL)
            b.start()
        create_topic(b, "t")
        new = make_records(80, tag="new")
        produce(b.bootstrap, "t", new)
        if restart == "after-recreation":
            b.stop()
            b.start()

        c = consumer(b.bootstrap, "resumers")
        try:
            assert committed(c, "t") == [OFFSET_INVALID]
            c.subscribe(["t"])
            got = poll_messages(c, 80)
            assert [m.offset() for m in got] == list(range(80))
            assert as_records(got) == new
        finally:
            c.close()
    finally:
        b.stop()
    if restart != "killed-between":
        assert_clean_log(b)


def test_consumer_groups_describe_works_after_the_topic_is_recreated(tmp_path, kafka_tools):
    with BrokerProcess(tmp_path, overrides=NO_DELAY) as b:
        create_topic(b, "t")
        produce(b.bootstrap, "t", make_records(60, tag="old"))
        consume_and_commit(b, "describers", "t", 60, commit_offset=50)
        delete_topic(b, "t")
        create_topic(b, "t")
        produce(b.bootstrap, "t", make_records(80, tag="new"))
        consume_and_commit(b, "describers", "t", 80)

        out = consumer_groups(b, "--describe", "--group", "describers")
        assert re.search(r"describers\s+t\s+0\s+80\s+80\s+0\s", out), out
    assert_clean_log(b)


def test_admin_client_deletes_an_empty_group_and_its_offsets_for_good(tmp_path):
    b = BrokerProcess(tmp_path, overrides=NO_DELAY).start()
    try:
        produce(b.bootstrap, "ledger", make_records(30))
        consume_and_commit(b, "gone", "ledger", 30)
        consume_and_commit(b, "kept", "ledger", 30, commit_offset=10)
        busy = consumer(b.bootstrap, "busy")
        try:
            busy.subscribe(["ledger"])
            poll_messages(busy, 30)
            a = admin(b)
            futures = a.delete_consumer_groups(["gone", "busy", "never"], request_timeout=30)
            futures["gone"].result(30)
            for group, code in (("busy", ck.KafkaError.NON_EMPTY_GROUP),
                                ("never", ck.KafkaError.GROUP_ID_NOT_FOUND)):
                with pytest.raises(ck.KafkaException) as raised:
                    futures[group].result(30)
                assert raised.value.args[0].code() == code
        finally:
            busy.close()

        b.stop()
        b.start()
        a = admin(b)
        listed = a.list_consumer_groups(request_timeout=30).result(30)
        assert {g.group_id for g in listed.valid} == {"kept", "busy"}
        c = consumer(b.bootstrap, "gone")
        try:
            assert committed(c, "ledger") == [OFFSET_INVALID]
        finally:
            c.close()
        c = consumer(b.bootstrap, "kept")
        try:
            assert committed(c, "ledger") == [10]
        finally:
            c.close()
    finally:
        b.stop()
    assert_clean_log(b)


def test_consumer_groups_delete_refuses_an_active_group_and_deletes_an_empty_one(
        tmp_path, kafka_tools):
    with BrokerProcess(tmp_path, overrides=NO_DELAY) as b:
        produce(b.bootstrap, "ledger", make_records(20))
        c = consumer(b.bootstrap, "cli-del")
        try:
            c.subscribe(["ledger"])
            poll_messages(c, 20)
            c.commit(asynchronous=False)
            out = consumer_groups(b, "--delete", "--group", "cli-del")
            assert "Error: Deletion of some consumer groups failed:" in out, out
            assert "* Group 'cli-del' could not be deleted due to: org.apache.kafka.common." \
                   "errors.GroupNotEmptyException: The group is not empty." in out, out
        finally:
            c.close()
        out = consumer_groups(b, "--delete", "--group", "cli-del")
        assert "Deletion of requested consumer groups ('cli-del') was successful." in out, out
        out = consumer_groups(b, "--describe", "--group", "cli-del")
        assert "GroupIdNotFoundException: Group cli-del not found." in out, out
    assert_clean_log(b)


def test_consumer_groups_delete_offsets_refuses_a_consumed_topic_and_deletes_the_others(
        tmp_path, kafka_tools):
    with BrokerProcess(tmp_path, overrides=NO_DELAY) as b:
        create_topic(b, "read", partitions=2)
        produce(b.bootstrap, "read", make_records(10), partition=0)
        produce(b.bootstrap, "other", make_records(10))
        consume_and_commit(b, "cli-offsets", "other", 10)   # an offset of a topic it left
        c = consumer(b.bootstrap, "cli-offsets")
        try:
            c.subscribe(["read"])
            poll_messages(c, 10)
            c.commit(asynchronous=False)
            out = consumer_groups(b, "--delete-offsets", "--group", "cli-offsets",
                                  "--topic", "read")
            assert "Error: Encountered some partition-level error" in out, out
            for p in (0, 1):
                assert re.search(rf"read\s+{p}\s+Error: org.apache.kafka.common.errors."
                                 r"GroupSubscribedToTopicException", out), out
            out = consumer_groups(b, "--delete-offsets", "--group", "cli-offsets",
                                  "--topic", "other")
            assert "Request succeeded for deleting offsets from group cli-offsets." in out, out
            assert re.search(r"other\s+0\s+Successful", out), out
            assert committed(c, "other") == [OFFSET_INVALID]
            assert committed(c, "read", (0,)) == [10]
        finally:
            c.close()
        # once the group is empty its offsets of any topic may go
        out = consumer_groups(b, "--delete-offsets", "--group", "cli-offsets", "--topic", "read")
        assert "Request succeeded for deleting offsets from group cli-offsets." in out, out
        assert re.search(r"read\s+0\s+Successful", out) and re.search(r"read\s+1\s+Successful",
                                                                       out), out
        out = consumer_groups(b, "--delete-offsets", "--group", "nobody", "--topic", "read")
        assert "Error: The group id does not exist." in out, out
        # the group, left without offsets, is still there to delete
        out = consumer_groups(b, "--delete", "--group", "cli-offsets")
        assert "Deletion of requested consumer groups ('cli-offsets') was successful." in out, out
    assert_clean_log(b)


# --------------------------------------------------------------------------- Kafka Connect

CONNECT_STANDALONE = "org.apache.kafka.connect.cli.ConnectStandalone"
CONNECT_PLUGIN_SOURCES = Path(__file__).parent / "connect_plugin"


def build_sink_plugin(work: Path) -> Path:
    """A plugin.path directory holding the discarding sink connector, compiled from
    ``connect_plugin/`` against the Kafka jars."""
    if shutil.which("javac") is None or shutil.which("jar") is None:
        pytest.skip("a JDK (javac, jar) is needed to build the test's Connect plugin")
    classes, plugins = work / "classes", work / "plugins"
    sources = sorted(str(p) for p in CONNECT_PLUGIN_SOURCES.rglob("*.java"))
    subprocess.run(["javac", "-cp", f"{kafka_libs()}/*", "-d", str(classes), *sources],
                   check=True, capture_output=True)
    shutil.copytree(CONNECT_PLUGIN_SOURCES / "META-INF", classes / "META-INF")
    plugins.mkdir()
    subprocess.run(["jar", "cf", str(plugins / "discarding-sink.jar"), "-C", str(classes), "."],
                   check=True, capture_output=True)
    return plugins


def rest(url: str, method: str = "GET", body=None) -> tuple[int, object]:
    """(HTTP status, the JSON body, or its text when it is not JSON)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode(errors="replace")


def wait_for(what: str, check, timeout: float = 90.0):
    """``check()``'s first truthy result, every half second (a REST endpoint not up yet counts as
    not yet); fail naming ``what`` if there is none."""
    return eventually(check, what, timeout, interval=0.5, ignoring=(OSError, urllib.error.URLError))


def sink_offsets(connect: str) -> dict[int, int] | None:
    """The sink connector's committed offsets by partition; None while Connect has no
    connector "sink" to answer for."""
    status, body = rest(f"{connect}/connectors/sink/offsets")
    if status == 404:
        return None
    assert status == 200, body
    return {o["partition"]["kafka_partition"]: o["offset"]["kafka_offset"]
            for o in body["offsets"]}


def group_state(b: BrokerProcess, group: str) -> str | None:
    a = admin(b)
    listed = a.list_consumer_groups(request_timeout=30).result(30)
    return next((g.state.name for g in listed.valid if g.group_id == group), None)


def test_kafka_connect_alters_deletes_and_resets_a_stopped_sink_connectors_offsets(
        tmp_path, kafka_tools):
    """Connect's offsets REST API (KIP-875) for a sink connector: PATCH with offsets
    (alterConsumerGroupOffsets), PATCH with null offsets (deleteConsumerGroupOffsets, that is
    OffsetDelete) and DELETE (deleteConsumerGroups) on the stopped connector's group."""
    plugins = build_sink_plugin(tmp_path)
    with BrokerProcess(tmp_path / "broker", overrides=NO_DELAY) as b:
        produce(b.bootstrap, "sinkin", make_records(30))
        rest_port = free_port()
        connect = f"http://127.0.0.1:{rest_port}"
        worker = tmp_path / "worker.properties"
        worker.write_text("\n".join([
            f"bootstrap.servers={b.bootstrap}",
            "key.converter=org.apache.kafka.connect.converters.ByteArrayConverter",
            "value.converter=org.apache.kafka.connect.converters.ByteArrayConverter",
            f"offset.storage.file.filename={tmp_path / 'connect.offsets'}",
            "offset.flush.interval.ms=500",
            f"listeners=http://127.0.0.1:{rest_port}",
            f"plugin.path={plugins}",
            "plugin.discovery=service_load",   # no reflective scan: the plugin has its manifest
            ""]))
        connector = tmp_path / "sink.properties"
        connector.write_text("name=sink\nconnector.class=strata.testing.DiscardingSinkConnector\n"
                             "topics=sinkin\ntasks.max=1\n")
        with open(tmp_path / "connect.log", "wb") as out:
            proc = subprocess.Popen(kafka_java_command(CONNECT_STANDALONE, str(worker),
                                                       str(connector)),
                                    stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_for("the sink to commit offset 30", lambda: sink_offsets(connect) == {0: 30},
                     timeout=120)
            status, body = rest(f"{connect}/connectors/sink/stop", "PUT")
            assert status in (202, 204), body
            wait_for("the connector to stop", lambda: rest(
                f"{connect}/connectors/sink/status")[1]["connector"]["state"] == "STOPPED")
            wait_for("its group to be empty", lambda: group_state(b, "connect-sink") == "EMPTY")

            partition = {"kafka_topic": "sinkin", "kafka_partition": 0}
            status, body = rest(f"{connect}/connectors/sink/offsets", "PATCH", {
                "offsets": [{"partition": partition, "offset": {"kafka_offset": 5}}]})
            assert status == 200, body
            assert sink_offsets(connect) == {0: 5}

            status, body = rest(f"{connect}/connectors/sink/offsets", "PATCH", {
                "offsets": [{"partition": partition, "offset": None}]})
            assert status == 200, body
            assert sink_offsets(connect) == {}

            status, body = rest(f"{connect}/connectors/sink/offsets", "PATCH", {
                "offsets": [{"partition": partition, "offset": {"kafka_offset": 7}}]})
            assert status == 200, body
            status, body = rest(f"{connect}/connectors/sink/offsets", "DELETE")
            assert status == 200, body
            assert "reset successfully" in body["message"], body
            assert sink_offsets(connect) == {}
            assert group_state(b, "connect-sink") is None
        finally:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    assert_clean_log(b)
