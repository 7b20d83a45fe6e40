"""``strata storage format``: prepare a broker's storage before its first start, as Kafka's
``kafka-storage format``; with ``--add-scram 'SCRAM-SHA-256=[name=alice,password=alice-secret]'``
(repeatable) it creates SCRAM credentials, so that the first client (or broker) can log in
before any broker runs to take AlterUserScramCredentials.

The argument is Kafka's (``ScramParser``): ``<mechanism>=[name=...,password=...]``, or
``salt=<base64>`` with ``saltedpassword=<base64>`` instead of a password, and ``iterations``
(4096 by default, within the mechanism's 4096..16384). Credentials go where the broker reads
them: with ``zookeeper.connect`` set, ZooKeeper's ``/config/users/<name>`` (the store
AlterUserScramCredentials writes, other entries of the user kept); otherwise the metadata
file of the first log dir (which is formatted, meta.properties written, if it is not yet).
Unlike Kafka, an already formatted log dir is not refused: the credentials are added to it.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import logging
from dataclasses import dataclass
from pathlib import Path

from strata.security.scram import MECHANISMS, ScramCredential, ScramFormatter, random_salt

__all__ = ["FormatError", "ScramArgument", "format_storage", "parse_add_scram"]

log = logging.getLogger(__name__)


class FormatError(ValueError):
    """An argument Kafka's formatter refuses; the message is Kafka's."""


@dataclass(frozen=True)
class ScramArgument:
    user: str
    mechanism: str
    salt: bytes
    salted_password: bytes
    iterations: int

    @property
    def credential(self) -> ScramCredential:
        return ScramFormatter(MECHANISMS[self.mechanism]).credential(
            self.salt, self.salted_password, self.iterations)


def _component(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep:
        raise FormatError(f"No equals sign found in SCRAM component: {text}")
    if len(value) >= 2 and value.startswith('"') and value.endswith('"'):
        value = value[1:-1]
    return key, value


def _b64(what: str, text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise FormatError(f"Failed to decode given {what}: {text}") from None


def parse_add_scram(argument: str) -> ScramArgument:
    """One ``--add-scram`` value, with Kafka's checks and messages."""
    text = argument.strip()
    mechanism_name, sep, config = text.partition("=")
    if not sep:
        raise FormatError(f"Failed to find equals sign in SCRAM argument '{text}'")
    mechanism = MECHANISMS.get(mechanism_name)
    if mechanism is None:
        raise FormatError(f"The add-scram mechanism {mechanism_name} is not supported.")
    if not config.startswith("["):
        raise FormatError("Expected configuration string to start with [")
    if not config.endswith("]"):
        raise FormatError("Expected configuration string to end with ]")
    components = dict(_component(c) for c in config[1:-1].split(","))
    user = components.pop("name", None)
    if user is None:
        raise FormatError("You must supply 'name' to add-scram")
    salt_text = components.pop("salt", None)
    salt = _b64("salt", salt_text) if salt_text is not None else None
    iterations_text = components.pop("iterations", None)
    try:
        iterations = int(iterations_text) if iterations_text is not None else 4096
    except ValueError:
        raise FormatError(f"Failed to parse iterations count: {iterations_text}") from None
    password = components.pop("password", None)
    salted_text = components.pop("saltedpassword", None)
    if password is None:
        if salted_text is None:
            raise FormatError("You must supply one of 'password' or 'saltedpassword' to add-scram")
        if salt is None:
            raise FormatError("You must supply 'salt' with 'saltedpassword' to add-scram")
        salted = _b64("saltedPassword", salted_text)
    if components:
        raise FormatError(f"Unknown SCRAM configurations: {', '.join(sorted(components))}")
    if iterations < mechanism.min_iterations:
        raise FormatError(f"The 'iterations' value must be >= {mechanism.min_iterations} for "
                          f"add-scram using {mechanism.name}")
    if iterations > mechanism.max_iterations:
        raise FormatError(f"The 'iterations' value must be <= {mechanism.max_iterations} for "
                          f"add-scram using {mechanism.name}")
    salt = salt if salt is not None else random_salt()
    if password is not None:
        salted = ScramFormatter(mechanism).salted_password(password, salt, iterations)
    return ScramArgument(user, mechanism.name, salt, salted, iterations)


def format_storage(props: dict[str, str], scram: list[ScramArgument]) -> str:
    """Store the credentials where a broker of ``props`` reads them; where that was."""
    from strata.cluster.scram_credentials import apply_changes
    from strata.security.scram import sanitize
    changes: dict[str, dict[str, ScramCredential]] = {}
    for arg in scram:
        changes.setdefault(arg.user, {})[arg.mechanism] = arg.credential
    from strata.cluster.zk.config import ZkClientConfig
    zk_config = ZkClientConfig.from_properties(props)
    if zk_config is not None:
        from strata.cluster.zk.client import StrataZkClient
        zk = StrataZkClient(zk_config).start()
        try:
            zk.create_top_level_paths()
            for user, change in changes.items():
                zk.update_entity_configs("users", sanitize(user),
                                         lambda config, change=change: apply_changes(config, change))
        finally:
            zk.close()
        return f"ZooKeeper {zk_config.connect} (/config/users)"
    from strata.cluster.metadata import ClusterMetadata
    raw = props.get("log.dirs", props.get("log.dir", "/tmp/kafka-logs"))
    log_dir = Path(raw.split(",")[0].strip())
    node_id = int(props.get("node.id", props.get("broker.id", "1")))
    from strata.cluster.scram_credentials import Upsertion
    metadata = ClusterMetadata(log_dir, node_id, props)
    try:   # the AlterUserScramCredentials path, one at a time (a request names a user once)
        results = [r for a in scram for r in metadata.alter_user_scram_credentials((), [
            Upsertion(a.user, MECHANISMS[a.mechanism].type, a.iterations, a.salt,
                      a.salted_password)])]
    finally:
        metadata.close()
    refused = [f"{r.user}: {r.message}" for r in results if r.message]
    if refused:
        raise FormatError("; ".join(refused))
    return str(log_dir)


def run(args: argparse.Namespace) -> int:
    from strata.cli.main import read_server_properties
    props = read_server_properties(args.config, args.override)
    try:
        scram = [parse_add_scram(a) for a in args.add_scram]
        where = format_storage(props, scram)
    except FormatError as exc:
        raise SystemExit(f"Error while formatting: {exc}") from None
    users = sorted({s.user for s in scram})
    print(f"Formatted {where}" + (f" with SCRAM credentials of {', '.join(users)}" if users else ""))
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", "-c", default=None, help="server.properties file")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--add-scram", "-S", action="append", default=[], metavar="SCRAM",
                        help="e.g. 'SCRAM-SHA-256=[name=alice,password=alice-secret]'")
    parser.set_defaults(fn=run)
