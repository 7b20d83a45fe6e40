"""Kafka's ACL authorizer: ``StandardAuthorizer`` (KRaft) / ``AclAuthorizer`` (ZooKeeper mode)
semantics over an index of bindings, stored by an ``AclStore`` (``strata.cluster.acl_store``).

A binding (``AclBinding``) is a resource pattern (type, name, LITERAL or PREFIXED; the LITERAL
name ``*`` matches every name of its type) and an entry (principal, host, operation, ALLOW or
DENY). A decision for principal P from host H doing operation O on resource type:name:

- P among ``super.users`` (``User:admin;User:broker``): allowed;
- otherwise the bindings whose pattern matches the resource are looked at: the literal name,
  the literal ``*`` and every PREFIXED pattern the name starts with. Those whose principal is
  P or ``User:*``, whose host is ``*`` or H, and whose operation is O or ALL apply; an ALLOW of
  READ, WRITE, DELETE or ALTER also applies to DESCRIBE, an ALLOW of ALTER_CONFIGS to
  DESCRIBE_CONFIGS (never a DENY). A DENY that applies wins; else an ALLOW that applies allows;
- no binding at all for the resource (any principal): ``allow.everyone.if.no.acl.found``
  (default false); some, none applying: denied.

The index, per resource type: literal bindings by name, prefixed ones by prefix, and the
prefix lengths present (counted as bindings come and go), so a decision costs a few dict
lookups (one per distinct prefix length) whatever the number of bindings.
Readers (the event loop) read immutable tuples that writers replace whole.

Decisions go to the ``kafka.authorizer.logger`` logger as Kafka's audit messages: denials at
INFO (when the action says ``log_if_denied``), allows at DEBUG (``log_if_allowed``), the rest
at TRACE level (5).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from strata.common.errors import ErrorCode, InvalidConfigError
from strata.protocol.codec import ApiKey
from strata.security.authorizer import (
    CLUSTER_NAME, CURRENT_REQUEST, WILDCARD_RESOURCE, AclOperation, AclPermissionType, Action,
    Authorizer, PatternType, ResourceType)
from strata.security.sasl import KafkaPrincipal

__all__ = ["AccessControlEntry", "AclBinding", "AclBindingFilter", "AclError", "AclStore",
           "MemoryAclStore", "ResourcePattern", "StandardAuthorizer", "authorizer_enabled",
           "validate_binding", "AUTHORIZER_CLASSES"]

audit_log = logging.getLogger("kafka.authorizer.logger")
TRACE = 5

WILDCARD_PRINCIPAL = "User:*"
WILDCARD_HOST = "*"

AUTHORIZER_CLASS = "authorizer.class.name"
SUPER_USERS = "super.users"
ALLOW_IF_NO_ACL = "allow.everyone.if.no.acl.found"
# the class names that turn the authorizer on (Kafka's two and Strata's own)
AUTHORIZER_CLASSES = frozenset({
    "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "kafka.security.authorizer.AclAuthorizer",
    "strata.security.acl_authorizer.StandardAuthorizer",
})

_IMPLIES_DESCRIBE = frozenset({AclOperation.DESCRIBE, AclOperation.READ, AclOperation.WRITE,
                               AclOperation.DELETE, AclOperation.ALTER})
_IMPLIES_DESCRIBE_CONFIGS = frozenset({AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS})

# Kafka's SecurityUtils names (ZooKeeper paths and JSON, audit messages)
RESOURCE_TYPE_NAMES = {
    ResourceType.TOPIC: "Topic", ResourceType.GROUP: "Group", ResourceType.CLUSTER: "Cluster",
    ResourceType.TRANSACTIONAL_ID: "TransactionalId",
    ResourceType.DELEGATION_TOKEN: "DelegationToken", ResourceType.USER: "User",
    ResourceType.ANY: "Any", ResourceType.UNKNOWN: "Unknown"}
OPERATION_NAMES = {op: "".join(w.capitalize() for w in op.name.split("_")) for op in AclOperation}
PERMISSION_NAMES = {p: p.name.capitalize() for p in AclPermissionType}


def _parse_enum(enum, value: str):
    """Kafka's fromString: the enum name or its SecurityUtils spelling, any case."""
    key = value.replace("_", "").upper()
    for member in enum:
        if member.name.replace("_", "") == key:
            return member
    raise ValueError(f"unknown {enum.__name__} {value!r}")


def parse_resource_type(value: str) -> ResourceType:
    return _parse_enum(ResourceType, value)


def parse_operation(value: str) -> AclOperation:
    return _parse_enum(AclOperation, value)


def parse_permission(value: str) -> AclPermissionType:
    return _parse_enum(AclPermissionType, value)


def parse_pattern_type(value: str) -> PatternType:
    return _parse_enum(PatternType, value)


class AclError(Exception):
    """A binding or filter Kafka refuses (INVALID_REQUEST), or a store failure (``code``)."""

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class ResourcePattern:
    resource_type: ResourceType
    name: str
    pattern_type: PatternType

    def __str__(self) -> str:
        return f"{RESOURCE_TYPE_NAMES[self.resource_type]}:{self.pattern_type.name}:{self.name}"


@dataclass(frozen=True, slots=True)
class AccessControlEntry:
    principal: str   # "User:alice"
    host: str
    operation: AclOperation
    permission_type: AclPermissionType

    def __str__(self) -> str:
        return (f"(principal={self.principal}, host={self.host}, "
                f"operation={self.operation.name}, permissionType={self.permission_type.name})")


@dataclass(frozen=True, slots=True)
class AclBinding:
    pattern: ResourcePattern
    entry: AccessControlEntry

    def __str__(self) -> str:
        return f"(pattern={self.pattern}, entry={self.entry})"


@dataclass(frozen=True, slots=True)
class AclBindingFilter:
    """Kafka's AclBindingFilter: None for a name, principal or host matches any; ANY for a
    type, pattern type, operation or permission matches any; pattern type MATCH matches the
    patterns that would apply to the named resource (literal name, ``*``, prefixes)."""

    resource_type: ResourceType = ResourceType.ANY
    name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: AclOperation = AclOperation.ANY
    permission_type: AclPermissionType = AclPermissionType.ANY

    def matches_pattern(self, pattern: ResourcePattern) -> bool:
        if self.resource_type != ResourceType.ANY and self.resource_type != pattern.resource_type:
            return False
        if self.pattern_type not in (PatternType.ANY, PatternType.MATCH) and \
                self.pattern_type != pattern.pattern_type:
            return False
        if self.name is None:
            return True
        if self.pattern_type in (PatternType.ANY, pattern.pattern_type):
            return self.name == pattern.name
        if pattern.pattern_type == PatternType.LITERAL:
            return self.name == pattern.name or pattern.name == WILDCARD_RESOURCE
        return self.name.startswith(pattern.name)   # PREFIXED

    def matches_entry(self, entry: AccessControlEntry) -> bool:
        return ((self.principal is None or self.principal == entry.principal)
                and (self.host is None or self.host == entry.host)
                and (self.operation == AclOperation.ANY or self.operation == entry.operation)
                and (self.permission_type == AclPermissionType.ANY
                     or self.permission_type == entry.permission_type))

    def matches(self, binding: AclBinding) -> bool:
        return self.matches_pattern(binding.pattern) and self.matches_entry(binding.entry)


def validate_binding(binding: AclBinding) -> None:
    """What Kafka refuses in a CreateAcls binding (``AclControlManager.validateNewAcl``, the
    handler's Cluster-name and empty-name checks, the ZooKeeper store's '/' in names, the
    principal's ``Type:name`` form); raises AclError with its message."""
    p, e = binding.pattern, binding.entry
    if p.resource_type in (ResourceType.UNKNOWN, ResourceType.ANY):
        raise AclError(f"Invalid resourceType {p.resource_type.name}")
    if p.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
        raise AclError(f"Invalid patternType {p.pattern_type.name}")
    if e.operation in (AclOperation.UNKNOWN, AclOperation.ANY):
        raise AclError(f"Invalid operation {e.operation.name}")
    if e.permission_type not in (AclPermissionType.ALLOW, AclPermissionType.DENY):
        raise AclError(f"Invalid permissionType {e.permission_type.name}")
    if not p.name:
        raise AclError("Invalid empty resource name")
    if p.resource_type == ResourceType.CLUSTER and p.name != CLUSTER_NAME:
        raise AclError(f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}")
    if p.pattern_type == PatternType.PREFIXED and p.name == WILDCARD_RESOURCE:
        # Kafka's ResourcePattern refuses a PREFIXED '*' (use a LITERAL '*' for every name)
        raise AclError("Invalid resource pattern: a PREFIXED pattern cannot be '*'")
    if "/" in p.name:
        raise AclError(f"ACL binding contains invalid resource name: {p.name}")
    kind, sep, name = e.principal.partition(":")
    if not sep or not kind:
        raise AclError(f"Could not parse principal from `{e.principal}` (no colon is present "
                       f"separating the principal type from the principal name)")
    if not e.host:
        raise AclError("Invalid empty host")


def validate_filter(f: AclBindingFilter) -> None:
    """DescribeAcls / DeleteAcls: a filter with an UNKNOWN element is INVALID_REQUEST."""
    if f.resource_type == ResourceType.UNKNOWN or f.pattern_type == PatternType.UNKNOWN:
        raise AclError("Unknown patternFilter.")
    if f.operation == AclOperation.UNKNOWN or f.permission_type == AclPermissionType.UNKNOWN:
        raise AclError("Unknown entryFilter.")


Entries = frozenset  # frozenset[AccessControlEntry]


class AclStore:
    """Where bindings live. ``load`` gives every resource's entries; ``update`` rewrites one
    resource's entries as ``change`` makes them from what is stored (durable, and seen by every
    broker, before it returns) and returns them; ``watch`` calls ``on_change(resource, entries)``
    when another writer changed a resource."""

    def load(self) -> dict[ResourcePattern, Entries]:
        raise NotImplementedError

    def update(self, resource: ResourcePattern, change) -> Entries:
        raise NotImplementedError

    def update_many(self, changes: dict) -> dict:
        """``update`` of each resource in ``changes`` (resource -> change): per resource its
        new entries or the exception its update raised. A store may write them at once."""
        out: dict = {}
        for resource, change in changes.items():
            try:
                out[resource] = self.update(resource, change)
            except Exception as exc:  # noqa: BLE001 - that resource's outcome
                out[resource] = exc
        return out

    def watch(self, on_change) -> None:
        pass

    def close(self) -> None:
        pass


class MemoryAclStore(AclStore):
    """Bindings in memory only (tests, and brokers that never persist)."""

    def __init__(self) -> None:
        self._acls: dict[ResourcePattern, Entries] = {}
        self._lock = threading.Lock()

    def load(self) -> dict[ResourcePattern, Entries]:
        return dict(self._acls)

    def update(self, resource: ResourcePattern, change) -> Entries:
        with self._lock:
            new = frozenset(change(self._acls.get(resource, frozenset())))
            if new:
                self._acls[resource] = new
            else:
                self._acls.pop(resource, None)
            return new


class _Rule:
    """Why a decision was made (the audit message's "based on rule ..."): a default, or the
    binding that decided, put into words only when logged."""
    __slots__ = ("allowed", "_text", "_acl")

    def __init__(self, allowed: bool, text: str = "", acl=None):
        self.allowed = allowed
        self._text = text
        self._acl = acl   # (resource type, pattern type, name, entry)

    @property
    def text(self) -> str:
        if self._acl is None:
            return self._text
        rtype, pattern_type, name, e = self._acl
        return (f"MatchingAcl(acl=StandardAcl(resourceType={rtype.name}, resourceName={name}, "
                f"patternType={pattern_type.name}, principal={e.principal}, host={e.host}, "
                f"op={e.operation.name}, permissionType={e.permission_type.name}))")


_SUPER_USER = _Rule(True, "SuperUser")
_DEFAULT_ALLOW = _Rule(True, "DefaultAllow")
_DEFAULT_DENY = _Rule(False, "DefaultDeny")


class StandardAuthorizer(Authorizer):
    """Kafka's StandardAuthorizer over an ``AclStore``: ``authorize`` for the handlers,
    ``acls`` / ``create_acls`` / ``delete_acls`` for the ACL admin APIs."""

    def __init__(self, store: AclStore | None = None, *, super_users: Iterable[str] = (),
                 allow_everyone_if_no_acl_found: bool = False):
        self.store = store if store is not None else MemoryAclStore()
        self.super_users = frozenset(super_users)
        self.allow_if_no_acl = allow_everyone_if_no_acl_found
        self._no_acl_rule = _DEFAULT_ALLOW if allow_everyone_if_no_acl_found else _DEFAULT_DENY
        self._write_lock = threading.RLock()
        # every resource's entries (what describe and delete read)
        self._resources: dict[ResourcePattern, Entries] = {}
        # the decision index, per resource type: name -> entries of literal patterns, prefix
        # -> entries of prefixed ones, the prefix lengths present (longest first)
        self._literal: dict[ResourceType, dict[str, tuple[AccessControlEntry, ...]]] = {
            t: {} for t in ResourceType}
        self._prefixed: dict[ResourceType, dict[str, tuple[AccessControlEntry, ...]]] = {
            t: {} for t in ResourceType}
        self._prefix_lengths: dict[ResourceType, tuple[int, ...]] = {t: () for t in ResourceType}
        self._prefix_counts: dict[ResourceType, dict[int, int]] = {}   # length -> prefixes

    @classmethod
    def from_properties(cls, props: Mapping[str, str], store: AclStore | None = None
                        ) -> "StandardAuthorizer":
        supers = [s.strip() for s in (props.get(SUPER_USERS) or "").split(";") if s.strip()]
        allow = (props.get(ALLOW_IF_NO_ACL) or "false").strip().lower()
        if allow not in ("true", "false"):
            raise InvalidConfigError(f"Invalid value {props.get(ALLOW_IF_NO_ACL)} for "
                                     f"configuration {ALLOW_IF_NO_ACL}: Expected value to be "
                                     f"either true or false")
        return cls(store, super_users=supers, allow_everyone_if_no_acl_found=allow == "true")

    # ---- loading and changes -------------------------------------------------------------------

    def start(self) -> "StandardAuthorizer":
        """Loads every binding from the store, then follows its changes."""
        with self._write_lock:
            for resource, entries in self.store.load().items():
                self._set(resource, entries)
        self.store.watch(self._on_store_change)
        log_count = sum(len(e) for e in self._resources.values())
        logging.getLogger(__name__).info("authorizer loaded %d ACL bindings on %d resources",
                                         log_count, len(self._resources))
        return self

    def close(self) -> None:
        self.store.close()

    def _on_store_change(self, resource: ResourcePattern, entries: Entries) -> None:
        with self._write_lock:
            self._set(resource, entries)

    def _set(self, resource: ResourcePattern, entries: Entries) -> None:
        """Makes ``entries`` the resource's (caller holds the write lock)."""
        entries = frozenset(entries)
        if entries:
            self._resources[resource] = entries
        else:
            self._resources.pop(resource, None)
        key = resource.name
        # DENY entries first: a decision stops at the first DENY that applies
        ordered = tuple(sorted(entries, key=lambda e: (e.permission_type != AclPermissionType.DENY,
                                                       e.principal, e.host, e.operation)))
        index = (self._literal if resource.pattern_type == PatternType.LITERAL
                 else self._prefixed)[resource.resource_type]
        had = key in index
        if ordered:
            index[key] = ordered
        else:
            index.pop(key, None)
        if resource.pattern_type == PatternType.PREFIXED and had != bool(ordered):
            rtype = resource.resource_type
            counts = self._prefix_counts.setdefault(rtype, {})
            size = len(resource.name)
            counts[size] = counts.get(size, 0) + (1 if ordered else -1)
            if not counts[size]:
                del counts[size]
            self._prefix_lengths[rtype] = tuple(sorted(counts, reverse=True))

    # ---- decisions -----------------------------------------------------------------------------

    def authorize(self, principal: KafkaPrincipal, host: str,
                  actions: Sequence[Action]) -> list[bool]:
        who = str(principal)
        if who in self.super_users:
            out = [True] * len(actions)
            if audit_log.isEnabledFor(logging.DEBUG):
                for action in actions:
                    self._audit(who, host, action, _SUPER_USER)
            return out
        out = []
        info = audit_log.isEnabledFor(logging.INFO)
        debug = info and audit_log.isEnabledFor(logging.DEBUG)
        trace = debug and audit_log.isEnabledFor(TRACE)
        decide = self._decide
        for action in actions:
            rule = decide(who, host, action)
            out.append(rule.allowed)
            if trace or (debug and action.log_if_allowed if rule.allowed
                         else info and action.log_if_denied):
                self._audit(who, host, action, rule)
        return out

    def authorize_by_resource_type(self, principal: KafkaPrincipal, host: str,
                                   operation: AclOperation, resource_type: ResourceType) -> bool:
        """Kafka's ``Authorizer.authorizeByResourceType``: whether the principal may do
        ``operation`` on some resource of the type. Allowed if a made-up name is (super users,
        allow.everyone.if.no.acl.found); else an ALLOW binding for the principal or User:*
        (operation or ALL, no implied operations) not dominated by a DENY: a LITERAL ``*``
        DENY denies all, a LITERAL DENY of the same name or a PREFIXED DENY of a prefix of
        the allowed name dominates it; a LITERAL ``*`` ALLOW allows."""
        if operation in (AclOperation.ANY, AclOperation.UNKNOWN) or resource_type in (
                ResourceType.ANY, ResourceType.UNKNOWN):
            raise ValueError(f"Must specify a specific operation and resource type, not "
                             f"{operation.name} and {resource_type.name}")
        if self.authorize(principal, host, [Action(operation, resource_type, "hardcode",
                                                   log_if_denied=False)])[0]:
            return True
        who = str(principal)
        deny_literal: set[str] = set()
        deny_prefixed: set[str] = set()
        allows: list[tuple[PatternType, str]] = []
        wildcard_allow = False
        for resource, entries in list(self._resources.items()):
            if resource.resource_type != resource_type:
                continue
            for e in entries:
                if e.host != WILDCARD_HOST and e.host != host:
                    continue
                if e.principal != who and e.principal != WILDCARD_PRINCIPAL:
                    continue
                if e.operation != operation and e.operation != AclOperation.ALL:
                    continue
                literal = resource.pattern_type == PatternType.LITERAL
                if e.permission_type == AclPermissionType.DENY:
                    if literal and resource.name == WILDCARD_RESOURCE:
                        return False
                    (deny_literal if literal else deny_prefixed).add(resource.name)
                elif e.permission_type == AclPermissionType.ALLOW:
                    if literal and resource.name == WILDCARD_RESOURCE:
                        wildcard_allow = True
                    else:
                        allows.append((resource.pattern_type, resource.name))
        if wildcard_allow:
            return True
        for pattern_type, name in allows:
            if pattern_type == PatternType.LITERAL and name in deny_literal:
                continue
            if not any(name[:i] in deny_prefixed for i in range(1, len(name) + 1)):
                return True
        return False

    def _decide(self, who: str, host: str, action: Action) -> _Rule:
        rtype, name, op = action.resource_type, action.name, action.operation
        candidates = []
        literal = self._literal[rtype]
        found = literal.get(name)
        if found:
            candidates.append((found, PatternType.LITERAL, name))
        if name != WILDCARD_RESOURCE:
            found = literal.get(WILDCARD_RESOURCE)
            if found:
                candidates.append((found, PatternType.LITERAL, WILDCARD_RESOURCE))
        lengths = self._prefix_lengths[rtype]
        if lengths:
            prefixed = self._prefixed[rtype]
            size = len(name)
            for length in lengths:
                if length <= size:
                    found = prefixed.get(name[:length])
                    if found:
                        candidates.append((found, PatternType.PREFIXED, name[:length]))
        if not candidates:
            return self._no_acl_rule
        allow = None
        for entries, pattern_type, pattern_name in candidates:
            for e in entries:
                if e.principal != who and e.principal != WILDCARD_PRINCIPAL:
                    continue
                if e.host != WILDCARD_HOST and e.host != host:
                    continue
                if e.permission_type == AclPermissionType.DENY:
                    if e.operation == op or e.operation == AclOperation.ALL:
                        return _Rule(False, acl=(rtype, pattern_type, pattern_name, e))
                elif allow is None and (
                        e.operation == op or e.operation == AclOperation.ALL
                        or (op == AclOperation.DESCRIBE and e.operation in _IMPLIES_DESCRIBE)
                        or (op == AclOperation.DESCRIBE_CONFIGS
                            and e.operation in _IMPLIES_DESCRIBE_CONFIGS)):
                    allow = (pattern_type, pattern_name, e)
        if allow is not None:
            return _Rule(True, acl=(rtype, *allow))
        return _DEFAULT_DENY

    def _audit(self, who: str, host: str, action: Action, rule: _Rule) -> None:
        """Kafka's audit message; the request is the one the Dispatcher is handling (Kafka's
        ApiKeys name), the reference count always 1."""
        if rule.allowed:
            level = logging.DEBUG if action.log_if_allowed else TRACE
        else:
            level = logging.INFO if action.log_if_denied else TRACE
        if not audit_log.isEnabledFor(level):
            return
        api_key = CURRENT_REQUEST.get()
        request = "" if api_key is None else f" for request = {_request_name(api_key)}"
        audit_log.log(level, "Principal = %s is %s operation = %s from host = %s on resource = "
                      "%s:%s:%s%s with resourceRefCount = 1 based on rule %s", who,
                      "Allowed" if rule.allowed else "Denied", action.operation.name, host,
                      RESOURCE_TYPE_NAMES[action.resource_type], action.pattern_type.name,
                      action.name, request, rule.text)

    # ---- the ACL admin APIs --------------------------------------------------------------------

    def acls(self, f: AclBindingFilter = AclBindingFilter()) -> list[AclBinding]:
        """Every binding the filter matches, by resource then entry."""
        out = []
        for resource, entries in list(self._resources.items()):
            if not f.matches_pattern(resource):
                continue
            for e in entries:
                if f.matches_entry(e):
                    out.append(AclBinding(resource, e))
        return out

    def create_acls(self, bindings: Sequence[AclBinding]) -> list[AclError | None]:
        """One result per binding (None: created or already there); a resource's bindings are
        written together. Blocks on the store: call it off the event loop."""
        results: list[AclError | None] = [None] * len(bindings)
        by_resource: dict[ResourcePattern, list[int]] = {}
        for i, b in enumerate(bindings):
            try:
                validate_binding(b)
            except AclError as exc:
                results[i] = exc
                continue
            by_resource.setdefault(b.pattern, []).append(i)
        with self._write_lock:
            outcomes = self.store.update_many({
                resource: (lambda cur, new=frozenset(bindings[i].entry for i in indexes): cur | new)
                for resource, indexes in by_resource.items()})
            for resource, indexes in by_resource.items():
                entries = outcomes[resource]
                if isinstance(entries, Exception):   # each binding gets the failure
                    error = entries if isinstance(entries, AclError) else AclError(
                        f"Failed to create ACL: {entries}", ErrorCode.UNKNOWN_SERVER_ERROR)
                    for i in indexes:
                        results[i] = error
                    continue
                self._set(resource, entries)
        for b, r in zip(bindings, results):
            if r is None:
                logging.getLogger(__name__).info("ACL created: %s", b)
        return results

    def delete_acls(self, filters: Sequence[AclBindingFilter]
                    ) -> list[tuple[AclError | None, list[tuple[AclBinding, AclError | None]]]]:
        """Per filter: its error, or the bindings it deleted (each with its own error)."""
        out: list = []
        valid: list[int] = []
        for i, f in enumerate(filters):
            try:
                validate_filter(f)
                out.append((None, []))
                valid.append(i)
            except AclError as exc:
                out.append((exc, []))
        with self._write_lock:
            # resource -> which filters match it
            touched: dict[ResourcePattern, list[int]] = {}
            # as Kafka's AclAuthorizer: the resources a definite filter names are looked up in
            # the store too (their bindings may not have reached this broker yet)
            named = [ResourcePattern(filters[i].resource_type, filters[i].name, pattern_type)
                     for i in valid if filters[i].name and "/" not in filters[i].name
                     and filters[i].resource_type != ResourceType.ANY
                     for pattern_type in ((PatternType.LITERAL, PatternType.PREFIXED)
                                          if filters[i].pattern_type == PatternType.ANY
                                          else (filters[i].pattern_type,))
                     if pattern_type in (PatternType.LITERAL, PatternType.PREFIXED)]
            for resource in dict.fromkeys([*self._resources, *named]):
                for i in valid:
                    if filters[i].matches_pattern(resource):
                        touched.setdefault(resource, []).append(i)
            removals: dict[ResourcePattern, dict[AccessControlEntry, int]] = {}
            changes = {}
            for resource, matched in touched.items():
                removed = removals[resource] = {}

                def change(cur, matched=matched, removed=removed):
                    removed.clear()
                    for e in cur:
                        for i in matched:
                            if filters[i].matches_entry(e):
                                removed[e] = i   # reported under the first matching filter
                                break
                    return cur - removed.keys()
                changes[resource] = change
            outcomes = self.store.update_many(changes)
            for resource, matched in touched.items():
                entries, removed = outcomes[resource], removals[resource]
                if isinstance(entries, Exception):   # reported per binding
                    error = entries if isinstance(entries, AclError) else AclError(
                        f"Failed to delete ACL: {entries}", ErrorCode.UNKNOWN_SERVER_ERROR)
                    for i in matched:
                        for e in self._resources.get(resource, ()):
                            if filters[i].matches_entry(e):
                                out[i][1].append((AclBinding(resource, e), error))
                    continue
                self._set(resource, entries)
                for e, i in removed.items():
                    out[i][1].append((AclBinding(resource, e), None))
                    logging.getLogger(__name__).info("ACL deleted: %s", AclBinding(resource, e))
        return out


def _request_name(api_key: int) -> str:
    """Kafka's ApiKeys name of a request (``Produce``, ``ListOffsets``, ``CreateAcls``)."""
    try:
        return "".join(w.capitalize() for w in ApiKey(api_key).name.split("_"))
    except ValueError:
        return str(api_key)


def authorizer_enabled(props: Mapping[str, str]) -> bool:
    """Whether ``authorizer.class.name`` turns the authorizer on; an unknown class name is a
    startup error (InvalidConfigError)."""
    name = (props.get(AUTHORIZER_CLASS) or "").strip()
    if not name:
        return False
    if name not in AUTHORIZER_CLASSES:
        raise InvalidConfigError(
            f"Invalid value {name} for configuration {AUTHORIZER_CLASS}: Class {name} cannot be "
            f"found (Strata supports {', '.join(sorted(AUTHORIZER_CLASSES))})")
    return True
