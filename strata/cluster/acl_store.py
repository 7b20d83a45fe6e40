"""Where the authorizer's bindings live (``strata.security.acl_authorizer.AclStore``).

In a ZooKeeper cluster, as Kafka 3.9's ``AclAuthorizer`` keeps them (``ZkAclStore``,
``ZkAclChangeStore``), one znode per resource pattern:

- ``/kafka-acl/<ResourceType>/<name>`` for LITERAL patterns, ``/kafka-acl-extended/prefixed/
  <ResourceType>/<name>`` for PREFIXED ones, holding
  ``{"version":1,"acls":[{"principal":"User:alice","permissionType":"Allow","operation":"Read",
  "host":"*"}]}``; a resource left without bindings loses its znode;
- each write is made against the version read (a concurrent writer's change is read again and
  kept), then announced by a sequential ``/kafka-acl-changes/acl_changes_<seq>`` holding
  ``TOPIC:name`` (LITERAL) or ``/kafka-acl-extended-changes/acl_changes_<seq>`` holding
  ``{"version":1,"resourceType":"TOPIC","name":"foo","patternType":"PREFIXED"}``;
- every broker watches both change paths and re-reads each resource announced after the last
  one it processed (``strata.cluster.zk_changes``, on its own thread), so a change made through any broker is in force on all
  within ZooKeeper's notification latency; notifications older than 15 minutes are purged.

On one broker without ZooKeeper: ``__strata_acls.json`` in the first log dir, rewritten whole
and atomically on each change::

    {"version": 1, "resources": [{"resourceType": "Topic", "patternType": "LITERAL",
      "name": "foo", "acls": [{"principal": "User:alice", ...}]}]}
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from strata.cluster.zk_changes import ChangeNotificationFollower
from strata.common.files import atomic_write
from strata.security.acl_authorizer import (
    OPERATION_NAMES, PERMISSION_NAMES, RESOURCE_TYPE_NAMES, AccessControlEntry, AclStore,
    Entries, ResourcePattern, parse_operation, parse_pattern_type, parse_permission,
    parse_resource_type)
from strata.security.authorizer import PatternType, ResourceType

log = logging.getLogger(__name__)

ACL_PATH = "/kafka-acl"
ACL_CHANGES_PATH = "/kafka-acl-changes"
EXTENDED_ACL_PATH = "/kafka-acl-extended"
PREFIXED_ACL_PATH = f"{EXTENDED_ACL_PATH}/prefixed"
EXTENDED_ACL_CHANGES_PATH = "/kafka-acl-extended-changes"
CHANGE_PREFIX = "acl_changes_"
ACLS_FILE = "__strata_acls.json"

_SPECIFIC_TYPES = (ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER,
                   ResourceType.TRANSACTIONAL_ID, ResourceType.DELEGATION_TOKEN, ResourceType.USER)


# ---- the JSON Kafka writes ---------------------------------------------------------------------

def entries_to_json(entries: Iterable[AccessControlEntry]) -> list[dict]:
    return [{"principal": e.principal, "permissionType": PERMISSION_NAMES[e.permission_type],
             "operation": OPERATION_NAMES[e.operation], "host": e.host}
            for e in sorted(entries, key=lambda e: (e.principal, e.host, e.operation,
                                                    e.permission_type))]


def entries_from_json(acls: Iterable[dict]) -> frozenset[AccessControlEntry]:
    return frozenset(AccessControlEntry(str(a["principal"]), str(a["host"]),
                                        parse_operation(str(a["operation"])),
                                        parse_permission(str(a["permissionType"])))
                     for a in acls)


def encode_acls(entries: Iterable[AccessControlEntry]) -> bytes:
    """A resource znode's data (Kafka's ``ResourceZNode.encode``)."""
    return json.dumps({"version": 1, "acls": entries_to_json(entries)},
                      separators=(",", ":")).encode()


def decode_acls(data: bytes | None) -> frozenset[AccessControlEntry]:
    if not data:
        return frozenset()
    return entries_from_json(json.loads(data).get("acls") or ())


def resource_path(resource: ResourcePattern) -> str:
    base = ACL_PATH if resource.pattern_type == PatternType.LITERAL else PREFIXED_ACL_PATH
    return f"{base}/{RESOURCE_TYPE_NAMES[resource.resource_type]}/{resource.name}"


def encode_change(resource: ResourcePattern) -> tuple[str, bytes]:
    """(change path, notification data) announcing a change of ``resource``."""
    if resource.pattern_type == PatternType.LITERAL:
        return ACL_CHANGES_PATH, f"{resource.resource_type.name}:{resource.name}".encode()
    return EXTENDED_ACL_CHANGES_PATH, json.dumps(
        {"version": 1, "resourceType": resource.resource_type.name, "name": resource.name,
         "patternType": resource.pattern_type.name}, separators=(",", ":")).encode()


def decode_change(change_path: str, data: bytes) -> ResourcePattern:
    text = data.decode()
    if change_path == ACL_CHANGES_PATH:
        rtype, sep, name = text.partition(":")
        if not sep:
            raise ValueError(f"expected a string in format ResourceType:ResourceName but got "
                             f"{text}")
        return ResourcePattern(parse_resource_type(rtype), name, PatternType.LITERAL)
    event = json.loads(text)
    if int(event.get("version", 1)) > 1:
        raise ValueError(f"Acl change event received for unsupported version: {event['version']}")
    return ResourcePattern(parse_resource_type(event["resourceType"]), event["name"],
                           parse_pattern_type(event["patternType"]))


# ---- one broker: a file in the log dir ---------------------------------------------------------

class FileAclStore(AclStore):
    """Bindings in ``__strata_acls.json`` of the log dir (one broker, no ZooKeeper)."""

    def __init__(self, log_dir: Path):
        self.path = Path(log_dir) / ACLS_FILE
        self._lock = threading.Lock()
        self._acls: dict[ResourcePattern, Entries] = self._read()

    def _read(self) -> dict[ResourcePattern, Entries]:
        if not self.path.exists():
            return {}
        doc = json.loads(self.path.read_bytes())
        out = {}
        for r in doc.get("resources") or ():
            resource = ResourcePattern(parse_resource_type(r["resourceType"]), str(r["name"]),
                                       parse_pattern_type(r["patternType"]))
            entries = entries_from_json(r.get("acls") or ())
            if entries:
                out[resource] = entries
        return out

    def _write(self, acls: dict[ResourcePattern, Entries]) -> None:
        resources = [{"resourceType": RESOURCE_TYPE_NAMES[r.resource_type],
                      "patternType": r.pattern_type.name, "name": r.name,
                      "acls": entries_to_json(e)}
                     for r, e in sorted(acls.items(), key=lambda i: (
                         i[0].resource_type, i[0].pattern_type, i[0].name))]
        atomic_write(self.path, json.dumps({"version": 1, "resources": resources},
                                           indent=1).encode())

    def load(self) -> dict[ResourcePattern, Entries]:
        with self._lock:
            return dict(self._acls)

    def update(self, resource: ResourcePattern, change) -> Entries:
        outcome = self.update_many({resource: change})[resource]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def update_many(self, changes: dict) -> dict:
        """Every change in one write of the file (all applied, or all failed with its error)."""
        with self._lock:
            acls = dict(self._acls)
            out: dict = {}
            for resource, change in changes.items():
                new = frozenset(change(acls.get(resource, frozenset())))
                if new:
                    acls[resource] = new
                else:
                    acls.pop(resource, None)
                out[resource] = new
            if acls == self._acls:
                return out
            try:
                self._write(acls)
            except Exception as exc:  # noqa: BLE001 - nothing was stored
                return dict.fromkeys(changes, exc)
            self._acls = acls
            return out


# ---- a cluster: ZooKeeper ----------------------------------------------------------------------

class ZkAclStore(AclStore):
    """Bindings in ZooKeeper as Kafka 3.9's AclAuthorizer keeps them (module docstring)."""

    def __init__(self, zk):   # strata.cluster.zk.client.StrataZkClient
        self.zk = zk
        self._on_change: Callable[[ResourcePattern, Entries], None] | None = None
        self._follower: ChangeNotificationFollower | None = None
        for path in (ACL_PATH, ACL_CHANGES_PATH, PREFIXED_ACL_PATH, EXTENDED_ACL_CHANGES_PATH):
            self.zk.make_sure_persistent_path_exists(path)

    def load(self) -> dict[ResourcePattern, Entries]:
        out: dict[ResourcePattern, Entries] = {}
        for base, pattern_type in ((ACL_PATH, PatternType.LITERAL),
                                   (PREFIXED_ACL_PATH, PatternType.PREFIXED)):
            for type_name in self.zk.get_children(base):
                try:
                    rtype = parse_resource_type(type_name)
                except ValueError:
                    log.warning("ignoring ACLs of unknown resource type %s/%s", base, type_name)
                    continue
                names = self.zk.get_children(f"{base}/{type_name}")
                found = self.zk.get_data_many([f"{base}/{type_name}/{n}" for n in names])
                for name, f in zip(names, found):
                    if f is None:
                        continue
                    resource = ResourcePattern(rtype, name, pattern_type)
                    try:
                        entries = decode_acls(f[0])
                    except (ValueError, KeyError, TypeError) as exc:
                        log.error("unreadable ACLs of %s in ZooKeeper: %s", resource, exc)
                        continue
                    if entries:
                        out[resource] = entries
        return out

    def _read(self, resource: ResourcePattern) -> tuple[Entries, int | None]:
        found = self.zk.get_data(resource_path(resource))
        if found is None:
            return frozenset(), None
        return decode_acls(found[0]), found[1].version

    def update(self, resource: ResourcePattern, change) -> Entries:
        from strata.cluster.zk.client import ZkNodeExistsError
        path = resource_path(resource)
        for _ in range(100):
            current, version = self._read(resource)
            new = frozenset(change(current))
            if new == current:
                return current
            if version is None:
                try:
                    self.zk.create_znode(path, encode_acls(new))
                except ZkNodeExistsError:
                    continue
            elif new:
                if not self.zk.set_data_if(path, encode_acls(new), version):
                    continue
            elif not self.zk.delete_if(path, version):
                continue
            change_path, data = encode_change(resource)
            self.zk.create_znode(f"{change_path}/{CHANGE_PREFIX}", data, sequence=True)
            return new
        raise RuntimeError(f"could not update {path}: it keeps changing")

    def watch(self, on_change) -> None:
        self._on_change = on_change
        self._follower = ChangeNotificationFollower(
            self.zk, (ACL_CHANGES_PATH, EXTENDED_ACL_CHANGES_PATH), CHANGE_PREFIX,
            self._notified, "acl-changes")
        self._follower.start()

    def close(self) -> None:
        if self._follower is not None:
            self._follower.close()

    def _notified(self, change_path: str, data: bytes) -> None:
        """Re-reads the resource a notification announces."""
        try:
            resource = decode_change(change_path, data)
        except (ValueError, KeyError, TypeError) as exc:
            log.error("unreadable ACL change notification in %s: %s", change_path, exc)
            return
        entries, _version = self._read(resource)
        if self._on_change is not None:
            self._on_change(resource, entries)
