"""One "broker" of a controller test, as its own OS process: registers ``/brokers/ids/N`` (again
after every new session), runs a ``ControllerService`` and prints what it does as JSON lines
on stdout (``registered``, ``elected``, ``live_brokers``, ``resigned``, ``notices``,
``answer``).

Reads JSON commands on stdin, one a line: ``{"op": "shrink_isr", "topic": T, "partition": P}``
submits the AlterPartition this broker would send as the partition's leader (dropping the ISR's
last follower), built from the controller's own image. Exits at stdin's end.

    python tests/controller_node.py --connect 127.0.0.1:2181/chroot --broker-id 1
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from strata.cluster.controller import ControllerService  # noqa: E402
from strata.cluster.controller_events import AlterPartition  # noqa: E402
from strata.cluster.image import BrokerRegistration, Endpoint  # noqa: E402
from strata.cluster.zk.client import StateChangeHandler, StrataZkClient  # noqa: E402
from strata.cluster.zk.config import ZkClientConfig  # noqa: E402
from strata.common.errors import KafkaError  # noqa: E402
from strata.common.types import TopicPartition  # noqa: E402

_print_lock = threading.Lock()


def emit(**fields) -> None:
    with _print_lock:
        sys.stdout.write(json.dumps(fields, default=str) + "\n")
        sys.stdout.flush()


class PrintingSink:
    """The NoticeSink of the test: every delivery becomes a ``notices`` line."""

    def deliver(self, broker_id, notices, controller_epoch) -> None:
        emit(event="notices", to=broker_id, controller_epoch=controller_epoch, notices=[
            {"kind": type(n).__name__, **{k: v for k, v in asdict(n).items() if k != "partition"},
             "topic": n.partition.topic, "partition": n.partition.partition} for n in notices])


class ControllerEventLines(logging.Handler):
    """The service's structured log records (``controller_event``) as lines."""

    def emit(self, record: logging.LogRecord) -> None:
        event = getattr(record, "controller_event", None)
        if event is not None:
            emit(event=event, controller_epoch=record.controller_epoch,
                 reason=getattr(record, "reason", None), brokers=getattr(record, "brokers", None))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--connect", required=True)
    parser.add_argument("--broker-id", type=int, required=True)
    parser.add_argument("--session-ms", type=int, default=3000)
    parser.add_argument("--rack")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(threadName)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("strata.cluster.controller").addHandler(ControllerEventLines())
    logging.getLogger("strata.cluster.controller").setLevel(logging.INFO)

    me = BrokerRegistration(args.broker_id, args.rack,
                            (Endpoint("PLAINTEXT", "127.0.0.1", 19000 + args.broker_id),))
    zk = StrataZkClient(ZkClientConfig(args.connect, args.session_ms)).start()
    zk.create_top_level_paths()
    epoch = {"value": -1}

    def register() -> None:
        epoch["value"] = zk.register_broker(me)
        emit(event="registered", broker=args.broker_id, broker_epoch=epoch["value"])

    register()
    zk.register_state_change_handler(StateChangeHandler(
        "broker-registration", after_initializing_session=register))
    service = ControllerService(zk, args.broker_id, PrintingSink()).start()

    for line in sys.stdin:
        command = json.loads(line)
        image = service.image
        reg = None if image is None else image.registration(
            TopicPartition(command["topic"], command["partition"]))
        if reg is None:
            emit(event="answer", op=command["op"], error="NOT_CONTROLLER", submitted=False)
            continue
        follower = next((r for r in reversed(reg.isr) if r != reg.leader), None)
        if follower is None:
            emit(event="answer", op=command["op"], error="NO_FOLLOWER", submitted=False)
            continue
        future = service.submit(AlterPartition(
            args.broker_id, epoch["value"], command["topic"], command["partition"],
            reg.leader_epoch, reg.partition_epoch, tuple(r for r in reg.isr if r != follower)))
        try:
            result = future.result()
            emit(event="answer", op=command["op"], error=result.response.error.name, submitted=True)
        except KafkaError as e:
            emit(event="answer", op=command["op"], error=e.code.name, submitted=True)
    service.close()
    zk.close()


if __name__ == "__main__":
    main()
