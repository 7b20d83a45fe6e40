"""SCRAM credentials of users: Kafka 4's rules for AlterUserScramCredentials
(``ScramControlManager.alterCredentials``) and DescribeUserScramCredentials
(``ScramImage.describe``), over the users' entity configs.

A user's entity config is what Kafka keeps in ZooKeeper's ``/config/users/<user>``: SCRAM
credentials under their mechanism's name in Kafka's string form (``strata.security.scram``),
beside any other entries of the entity (client quotas, as Kafka's ZooKeeper mode writes them),
which an alteration leaves as they were. ``ClusterMetadata`` keeps these configs in its
metadata file, ``ZkClusterMetadata`` in ZooKeeper; both plan with ``plan_alteration`` and
answer with ``describe``.

Rules (Kafka 4): a user may be named once per request, over deletions and upsertions together
(DUPLICATE_RESOURCE "A user credential cannot be altered twice in the same request"); an empty
name is UNACCEPTABLE_CREDENTIAL, an unknown mechanism UNSUPPORTED_SASL_MECHANISM, iterations
outside 4096..16384 UNACCEPTABLE_CREDENTIAL, the deletion of a credential the user does not
have RESOURCE_NOT_FOUND; a user's first error is the one reported. Pure functions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from strata.common.errors import ErrorCode
from strata.security.scram import (
    MECHANISMS, MECHANISMS_BY_TYPE, ScramCredential, ScramFormatter, credential_to_string)

DUPLICATE = "A user credential cannot be altered twice in the same request"
EMPTY_USER = "Username must not be empty"
UNKNOWN_MECHANISM = "Unknown SCRAM mechanism"
TOO_FEW_ITERATIONS = "Too few iterations"
TOO_MANY_ITERATIONS = "Too many iterations"
DELETE_MISSING = "Attempt to delete a user credential that does not exist"
DESCRIBE_DUPLICATE = "Cannot describe SCRAM credentials for the same user twice in a single request: "
DESCRIBE_MISSING = "Attempt to describe a user credential that does not exist: "


@dataclass(frozen=True)
class Deletion:
    user: str
    mechanism: int   # Kafka's type byte: 1 SCRAM-SHA-256, 2 SCRAM-SHA-512


@dataclass(frozen=True)
class Upsertion:
    user: str
    mechanism: int
    iterations: int
    salt: bytes
    salted_password: bytes


@dataclass(frozen=True)
class AlterResult:
    user: str
    error: ErrorCode
    message: str | None


@dataclass(frozen=True)
class DescribeResult:
    user: str
    error: ErrorCode
    message: str | None
    credentials: tuple[tuple[int, int], ...]   # (mechanism type, iterations)


# user -> {mechanism name: the new credential, or None to delete it}
Changes = dict[str, dict[str, "ScramCredential | None"]]


def _check_user_and_mechanism(user: str, mechanism: int) -> tuple[ErrorCode, str] | None:
    if user == "":
        return ErrorCode.UNACCEPTABLE_CREDENTIAL, EMPTY_USER
    if mechanism not in MECHANISMS_BY_TYPE:
        return ErrorCode.UNSUPPORTED_SASL_MECHANISM, UNKNOWN_MECHANISM
    return None


def plan_alteration(deletions: Iterable[Deletion], upsertions: Iterable[Upsertion],
                    has_credential: Callable[[str, str], bool]
                    ) -> tuple[list[AlterResult], Changes]:
    """One result per user named (successes, deletions first, then failures) and the changes to
    make; ``has_credential(user, mechanism name)`` tells what is stored now."""
    to_delete: dict[str, Deletion] = {}
    to_upsert: dict[str, Upsertion] = {}
    errors: dict[str, tuple[ErrorCode, str]] = {}
    for d in deletions:
        if d.user in errors:
            continue
        if to_delete.pop(d.user, None) is not None:
            errors[d.user] = (ErrorCode.DUPLICATE_RESOURCE, DUPLICATE)
            continue
        error = _check_user_and_mechanism(d.user, d.mechanism)
        if error is None and not has_credential(d.user, MECHANISMS_BY_TYPE[d.mechanism].name):
            error = (ErrorCode.RESOURCE_NOT_FOUND, DELETE_MISSING)
        if error is not None:
            errors[d.user] = error
        else:
            to_delete[d.user] = d
    for u in upsertions:
        if u.user in errors:
            continue
        if to_delete.pop(u.user, None) is not None or to_upsert.pop(u.user, None) is not None:
            errors[u.user] = (ErrorCode.DUPLICATE_RESOURCE, DUPLICATE)
            continue
        error = _check_user_and_mechanism(u.user, u.mechanism)
        if error is None:
            mechanism = MECHANISMS_BY_TYPE[u.mechanism]
            if u.iterations < mechanism.min_iterations:
                error = (ErrorCode.UNACCEPTABLE_CREDENTIAL, TOO_FEW_ITERATIONS)
            elif u.iterations > mechanism.max_iterations:
                error = (ErrorCode.UNACCEPTABLE_CREDENTIAL, TOO_MANY_ITERATIONS)
        if error is not None:
            errors[u.user] = error
        else:
            to_upsert[u.user] = u
    results: list[AlterResult] = []
    changes: Changes = {}
    for d in to_delete.values():
        changes.setdefault(d.user, {})[MECHANISMS_BY_TYPE[d.mechanism].name] = None
        results.append(AlterResult(d.user, ErrorCode.NONE, None))
    for u in to_upsert.values():
        mechanism = MECHANISMS_BY_TYPE[u.mechanism]
        changes.setdefault(u.user, {})[mechanism.name] = ScramFormatter(mechanism).credential(
            bytes(u.salt), bytes(u.salted_password), u.iterations)
        results.append(AlterResult(u.user, ErrorCode.NONE, None))
    results += [AlterResult(user, code, message) for user, (code, message) in errors.items()]
    return results, changes


def apply_changes(config: Mapping[str, str], changes: Mapping[str, ScramCredential | None]
                  ) -> dict[str, str]:
    """A user's entity config after ``changes``; its other entries stay as they are."""
    out = dict(config)
    for name, credential in changes.items():
        if credential is None:
            out.pop(name, None)
        else:
            out[name] = credential_to_string(credential)
    return out


def describe(users: Iterable[str] | None,
             credentials: Callable[[str], Mapping[str, ScramCredential]],
             all_users: Callable[[], Iterable[str]]) -> list[DescribeResult]:
    """DescribeUserScramCredentials: ``users`` None or empty for every user with a
    credential (by name), else each user named once, in order; ``credentials(user)`` gives a
    user's credentials by mechanism name."""
    names = list(users or ())
    if not names:
        out = []
        for user in sorted(set(all_users())):
            found = credentials(user)
            if found:
                out.append(DescribeResult(user, ErrorCode.NONE, None, _infos(found)))
        return out
    counts: dict[str, int] = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    out = []
    for user, times in counts.items():
        if times > 1:
            out.append(DescribeResult(user, ErrorCode.DUPLICATE_RESOURCE,
                                      DESCRIBE_DUPLICATE + user, ()))
            continue
        found = credentials(user)
        if found:
            out.append(DescribeResult(user, ErrorCode.NONE, None, _infos(found)))
        else:
            out.append(DescribeResult(user, ErrorCode.RESOURCE_NOT_FOUND,
                                      DESCRIBE_MISSING + user, ()))
    return out


def _infos(found: Mapping[str, ScramCredential]) -> tuple[tuple[int, int], ...]:
    return tuple((MECHANISMS[name].type, c.iterations)
                 for name, c in sorted(found.items(), key=lambda e: MECHANISMS[e[0]].type))
