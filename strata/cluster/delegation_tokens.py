"""Delegation tokens (KIP-48) as Kafka 3.9's ZooKeeper mode has them (``DelegationTokenManager``,
``DelegationTokenManagerZk``, ``DelegationTokenCache``): their rules, where they are kept, and
the SCRAM credentials a token authenticates with.

Settings (Kafka's): ``delegation.token.secret.key`` (or the older ``delegation.token.master.key``)
turns tokens on; without it every token request is DELEGATION_TOKEN_AUTH_DISABLED.
``delegation.token.max.lifetime.ms`` (7 days) bounds a token's life, ``delegation.token.expiry
.time.ms`` (1 day) is how long a creation or renewal lasts when the request names no period,
``delegation.token.expiry.check.interval.ms`` (1 hour) how often expired tokens are removed
(by every broker; Kafka's ZooKeeper mode has its controller do it).

A token is its ``TokenInformation`` (id: a random UUID in unpadded URL-safe base64; owner,
requester, renewers; issue, expiry and max timestamps in ms) and its HMAC, HMAC-SHA512 of the
id's UTF-8 bytes keyed by the secret key's, so every broker with the same key computes it. A
client authenticates with SCRAM (either mechanism), the extension ``tokenauth=true``, the token
id as user name and the HMAC in base64 as password; the broker derives the SCRAM credential
from that password (4096 iterations, a salt of its own) and the principal is the token's owner,
marked token-authenticated (such a connection may not create, renew, expire or describe
tokens). A token whose expiry has passed no longer authenticates, even before the periodic
check removes it (Kafka's cache accepts it until then, for a session that ends at once).

Renew and expire are for the owner or a renewer (else DELEGATION_TOKEN_OWNER_MISMATCH), of a
token known by its HMAC (else DELEGATION_TOKEN_NOT_FOUND) that has not expired (else
DELEGATION_TOKEN_EXPIRED, except an expiry with a negative period, which removes the token at
once); the new expiry is now plus the period (the default when negative for a renewal), never
past the max timestamp.

Storage: in a ZooKeeper cluster, as Kafka's ``ZkClient``: ``/delegation_token/tokens/<tokenId>``
holding ``{"version":3,"owner":"User%3Aalice","tokenRequester":"User%3Aalice","renewers":[],
"issueTimestamp":...,"maxTimestamp":...,"expiryTimestamp":...,"tokenId":"..."}`` (principals
sanitized), each change announced by a sequential ``/delegation_token/token_changes/
token_change_<seq>`` holding the token id, which every broker follows
(``strata.cluster.zk_changes``) and answers by re-reading that token. On one broker without
ZooKeeper: ``__strata_delegation_tokens.json`` in the first log dir, rewritten atomically.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from strata.common.errors import ErrorCode
from strata.common.files import atomic_write
from strata.security.sasl import KafkaPrincipal
from strata.security.scram import MECHANISMS, ScramCredential, ScramFormatter, desanitize, sanitize

log = logging.getLogger(__name__)

SECRET_KEY_CONFIG = "delegation.token.secret.key"
MASTER_KEY_CONFIG = "delegation.token.master.key"    # Kafka's deprecated name
MAX_LIFETIME_CONFIG = "delegation.token.max.lifetime.ms"
EXPIRY_TIME_CONFIG = "delegation.token.expiry.time.ms"
EXPIRY_CHECK_INTERVAL_CONFIG = "delegation.token.expiry.check.interval.ms"
MAX_LIFETIME_DEFAULT_MS = 7 * 24 * 60 * 60 * 1000
EXPIRY_TIME_DEFAULT_MS = 24 * 60 * 60 * 1000
EXPIRY_CHECK_INTERVAL_DEFAULT_MS = 60 * 60 * 1000
ERROR_TIMESTAMP = -1

TOKEN_AUTH_PATH = "/delegation_token"
TOKENS_PATH = f"{TOKEN_AUTH_PATH}/tokens"
TOKEN_CHANGES_PATH = f"{TOKEN_AUTH_PATH}/token_changes"
TOKEN_CHANGE_PREFIX = "token_change_"
TOKENS_FILE = "__strata_delegation_tokens.json"
JSON_VERSION = 3


@dataclass(frozen=True)
class TokenConfig:
    secret_key: str | None
    max_lifetime_ms: int = MAX_LIFETIME_DEFAULT_MS
    expiry_time_ms: int = EXPIRY_TIME_DEFAULT_MS
    expiry_check_interval_ms: int = EXPIRY_CHECK_INTERVAL_DEFAULT_MS

    @property
    def enabled(self) -> bool:
        return bool(self.secret_key)

    @classmethod
    def from_properties(cls, props: Mapping[str, str]) -> "TokenConfig":
        key = props.get(SECRET_KEY_CONFIG) or props.get(MASTER_KEY_CONFIG) or None
        return cls(key, int(props.get(MAX_LIFETIME_CONFIG) or MAX_LIFETIME_DEFAULT_MS),
                   int(props.get(EXPIRY_TIME_CONFIG) or EXPIRY_TIME_DEFAULT_MS),
                   int(props.get(EXPIRY_CHECK_INTERVAL_CONFIG)
                       or EXPIRY_CHECK_INTERVAL_DEFAULT_MS))


def parse_principal(text: str) -> KafkaPrincipal:
    """Kafka's ``SecurityUtils.parseKafkaPrincipal``: ``Type:name``."""
    ptype, sep, name = text.partition(":")
    if not sep or not ptype:
        raise ValueError(f"expected a string in format principalType:principalName but got "
                         f"{text}")
    return KafkaPrincipal(ptype, name)


@dataclass(frozen=True)
class TokenInformation:
    token_id: str
    owner: KafkaPrincipal
    token_requester: KafkaPrincipal
    renewers: tuple[KafkaPrincipal, ...]
    issue_timestamp: int
    max_timestamp: int
    expiry_timestamp: int

    def owner_or_renewer(self, principal: KafkaPrincipal) -> bool:
        """Kafka's ``TokenInformation.ownerOrRenewer`` (the requester counts too)."""
        return (principal == self.owner or principal == self.token_requester
                or principal in self.renewers)

    def expired(self, now_ms: int) -> bool:
        return self.max_timestamp < now_ms or self.expiry_timestamp < now_ms

    def to_json(self) -> dict:
        return {"version": JSON_VERSION, "owner": sanitize(str(self.owner)),
                "tokenRequester": sanitize(str(self.token_requester)),
                "renewers": [sanitize(str(r)) for r in self.renewers],
                "issueTimestamp": self.issue_timestamp, "maxTimestamp": self.max_timestamp,
                "expiryTimestamp": self.expiry_timestamp, "tokenId": self.token_id}

    @classmethod
    def from_json(cls, doc: Mapping) -> "TokenInformation":
        owner = parse_principal(desanitize(str(doc["owner"])))
        requester = (parse_principal(desanitize(str(doc["tokenRequester"])))
                     if int(doc.get("version", 1)) >= 3 and doc.get("tokenRequester") else owner)
        return cls(str(doc["tokenId"]), owner, requester,
                   tuple(parse_principal(desanitize(str(r))) for r in doc.get("renewers") or ()),
                   int(doc["issueTimestamp"]), int(doc["maxTimestamp"]),
                   int(doc["expiryTimestamp"]))


@dataclass(frozen=True)
class DelegationToken:
    info: TokenInformation
    hmac: bytes = field(repr=False)


@dataclass(frozen=True)
class CreateResult:
    error: ErrorCode
    token: DelegationToken | None = None


def create_hmac(token_id: str, secret_key: str) -> bytes:
    """HMAC-SHA512 of the token id keyed by the secret key (Kafka's ``createHmac``)."""
    return hmac.new(secret_key.encode("utf-8"), token_id.encode("utf-8"), hashlib.sha512).digest()


def new_token_id() -> str:
    """Kafka's ``CoreUtils.generateUuidAsBase64``."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode("ascii")


# ---- where tokens are kept ---------------------------------------------------------------------

class TokenStore:
    """Tokens by id; ``watch`` reports changes made elsewhere (``on_change(token_id)``)."""

    def load(self) -> dict[str, TokenInformation]:
        raise NotImplementedError

    def get(self, token_id: str) -> TokenInformation | None:
        raise NotImplementedError

    def put(self, info: TokenInformation) -> None:
        raise NotImplementedError

    def remove(self, token_id: str) -> None:
        raise NotImplementedError

    def watch(self, on_change: Callable[[str], None]) -> None:
        pass

    def close(self) -> None:
        pass


class FileTokenStore(TokenStore):
    """``__strata_delegation_tokens.json`` of the log dir (one broker, no ZooKeeper)."""

    def __init__(self, log_dir: Path):
        self.path = Path(log_dir) / TOKENS_FILE
        self._lock = threading.Lock()
        self._tokens: dict[str, TokenInformation] = {}
        if self.path.exists():
            for doc in json.loads(self.path.read_bytes()).get("tokens") or ():
                info = TokenInformation.from_json(doc)
                self._tokens[info.token_id] = info

    def _write(self, tokens: dict[str, TokenInformation]) -> None:
        atomic_write(self.path, json.dumps(
            {"version": 1, "tokens": [t.to_json() for _, t in sorted(tokens.items())]},
            indent=1).encode())
        self._tokens = tokens

    def load(self) -> dict[str, TokenInformation]:
        with self._lock:
            return dict(self._tokens)

    def get(self, token_id: str) -> TokenInformation | None:
        with self._lock:
            return self._tokens.get(token_id)

    def put(self, info: TokenInformation) -> None:
        with self._lock:
            self._write({**self._tokens, info.token_id: info})

    def remove(self, token_id: str) -> None:
        with self._lock:
            if token_id in self._tokens:
                self._write({k: v for k, v in self._tokens.items() if k != token_id})


class ZkTokenStore(TokenStore):
    """Tokens in ZooKeeper as Kafka 3.9 keeps them (module docstring)."""

    def __init__(self, zk):   # strata.cluster.zk.client.StrataZkClient
        self.zk = zk
        self._follower = None
        for path in (TOKENS_PATH, TOKEN_CHANGES_PATH):
            self.zk.make_sure_persistent_path_exists(path)

    @staticmethod
    def _decode(data: bytes | None) -> TokenInformation | None:
        if not data:
            return None
        return TokenInformation.from_json(json.loads(data))

    def load(self) -> dict[str, TokenInformation]:
        names = self.zk.get_children(TOKENS_PATH)
        out = {}
        for name, f in zip(names, self.zk.get_data_many([f"{TOKENS_PATH}/{n}" for n in names])):
            if f is None:
                continue
            try:
                info = self._decode(f[0])
            except (ValueError, KeyError, TypeError) as exc:
                log.error("unreadable delegation token %s in ZooKeeper: %s", name, exc)
                continue
            if info is not None:
                out[info.token_id] = info
        return out

    def get(self, token_id: str) -> TokenInformation | None:
        found = self.zk.get_data(f"{TOKENS_PATH}/{token_id}")
        return None if found is None else self._decode(found[0])

    def _notify(self, token_id: str) -> None:
        self.zk.create_znode(f"{TOKEN_CHANGES_PATH}/{TOKEN_CHANGE_PREFIX}",
                             token_id.encode("utf-8"), sequence=True)

    def put(self, info: TokenInformation) -> None:
        """Kafka's ``setOrCreateDelegationToken``: the last writer wins."""
        from strata.cluster.zk.client import ZkNodeExistsError
        path = f"{TOKENS_PATH}/{info.token_id}"
        data = json.dumps(info.to_json(), separators=(",", ":")).encode()
        for _ in range(100):
            found = self.zk.get_data(path)
            if found is None:
                try:
                    self.zk.create_znode(path, data)
                except ZkNodeExistsError:
                    continue
            elif not self.zk.set_data_if(path, data, found[1].version):
                continue
            self._notify(info.token_id)
            return
        raise RuntimeError(f"could not write {path}: it keeps changing")

    def remove(self, token_id: str) -> None:
        """Deletes the token and announces it; nothing when it is already gone (every broker's
        expiry check removes an expired token: one notification)."""
        path = f"{TOKENS_PATH}/{token_id}"
        for _ in range(100):
            found = self.zk.get_data(path)
            if found is None:
                return
            if self.zk.delete_if(path, found[1].version):
                self._notify(token_id)
                return
        raise RuntimeError(f"could not delete {path}: it keeps changing")

    def watch(self, on_change: Callable[[str], None]) -> None:
        from strata.cluster.zk_changes import ChangeNotificationFollower
        self._follower = ChangeNotificationFollower(
            self.zk, (TOKEN_CHANGES_PATH,), TOKEN_CHANGE_PREFIX,
            lambda _path, data: on_change(data.decode("utf-8")), "token-changes")
        self._follower.start()

    def close(self) -> None:
        if self._follower is not None:
            self._follower.close()


# ---- the manager -------------------------------------------------------------------------------

class DelegationTokenManager:
    """The broker's tokens: a cache of the store (by id and by HMAC), Kafka's rules for the
    four token APIs, the SCRAM credentials of ``tokenauth`` logins, and the removal of expired
    tokens every ``delegation.token.expiry.check.interval.ms``. Thread-safe: handlers call it
    from worker threads (the ZooKeeper store blocks), the follower and the expiry check from
    their own."""

    def __init__(self, config: TokenConfig, store: TokenStore,
                 clock: Callable[[], float] = time.time):
        if not config.enabled:
            raise ValueError(f"{SECRET_KEY_CONFIG} is not set: delegation tokens are disabled")
        self.config = config
        self.store = store
        self._clock = clock
        self._lock = threading.RLock()
        self._tokens: dict[str, TokenInformation] = {}
        self._by_hmac: dict[bytes, str] = {}
        self._scram: dict[tuple[str, str], ScramCredential] = {}
        self._stop = threading.Event()
        self._checker: threading.Thread | None = None

    @classmethod
    def from_properties(cls, props: Mapping[str, str], store_factory: Callable[[], TokenStore]
                        ) -> "DelegationTokenManager | None":
        """The broker's manager, or None when no secret key turns tokens on."""
        config = TokenConfig.from_properties(props)
        return cls(config, store_factory()) if config.enabled else None

    def _now(self) -> int:
        return int(self._clock() * 1000)

    def hmac(self, token_id: str) -> bytes:
        return create_hmac(token_id, self.config.secret_key)

    # -- cache

    def start(self) -> "DelegationTokenManager":
        with self._lock:
            for info in self.store.load().values():
                self._cache(info)
        self.store.watch(self.refresh)
        self._checker = threading.Thread(target=self._check_expiry, name="token-expiry",
                                         daemon=True)
        self._checker.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self.store.close()
        if self._checker is not None:
            self._checker.join(timeout=5)

    def _cache(self, info: TokenInformation) -> None:
        old = self._tokens.get(info.token_id)
        self._tokens[info.token_id] = info
        if old is None:
            self._by_hmac[self.hmac(info.token_id)] = info.token_id

    def _uncache(self, token_id: str) -> None:
        if self._tokens.pop(token_id, None) is not None:
            self._by_hmac.pop(self.hmac(token_id), None)
        for name in MECHANISMS:
            self._scram.pop((token_id, name), None)

    def refresh(self, token_id: str) -> None:
        """A change notification: the token as the store now has it (Kafka's
        ``processNotification``)."""
        info = self.store.get(token_id)
        with self._lock:
            if info is None:
                self._uncache(token_id)
            else:
                self._cache(info)

    def tokens(self) -> list[TokenInformation]:
        with self._lock:
            return list(self._tokens.values())

    def _update(self, info: TokenInformation) -> None:
        self.store.put(info)
        with self._lock:
            self._cache(info)

    def remove(self, token_id: str) -> None:
        self.store.remove(token_id)
        with self._lock:
            self._uncache(token_id)

    # -- the APIs

    def create(self, owner: KafkaPrincipal, requester: KafkaPrincipal,
               renewers: Iterable[KafkaPrincipal], max_lifetime_ms: int) -> CreateResult:
        now = self._now()
        limit = self.config.max_lifetime_ms
        lifetime = limit if max_lifetime_ms <= 0 else min(max_lifetime_ms, limit)
        max_ts = now + lifetime
        info = TokenInformation(new_token_id(), owner, requester, tuple(renewers), now, max_ts,
                                min(max_ts, now + self.config.expiry_time_ms))
        self._update(info)
        return CreateResult(ErrorCode.NONE, DelegationToken(info, self.hmac(info.token_id)))

    def _token_of(self, principal: KafkaPrincipal, token_hmac: bytes
                  ) -> tuple[ErrorCode, TokenInformation | None]:
        with self._lock:
            info = self._tokens.get(self._by_hmac.get(bytes(token_hmac), ""))
        if info is None:
            return ErrorCode.DELEGATION_TOKEN_NOT_FOUND, None
        if principal != info.owner and principal not in info.renewers:
            return ErrorCode.DELEGATION_TOKEN_OWNER_MISMATCH, None
        return ErrorCode.NONE, info

    def renew(self, principal: KafkaPrincipal, token_hmac: bytes, renew_period_ms: int
              ) -> tuple[ErrorCode, int]:
        """(error, new expiry timestamp) of Kafka's ``renewToken``."""
        error, info = self._token_of(principal, token_hmac)
        if info is None:
            return error, ERROR_TIMESTAMP
        now = self._now()
        if info.expired(now):
            return ErrorCode.DELEGATION_TOKEN_EXPIRED, ERROR_TIMESTAMP
        period = self.config.expiry_time_ms if renew_period_ms < 0 else renew_period_ms
        expiry = min(info.max_timestamp, now + period)
        self._update(replace(info, expiry_timestamp=expiry))
        return ErrorCode.NONE, expiry

    def expire(self, principal: KafkaPrincipal, token_hmac: bytes, expiry_period_ms: int
               ) -> tuple[ErrorCode, int]:
        """(error, new expiry timestamp) of Kafka's ``expireToken``: a negative period removes
        the token now."""
        error, info = self._token_of(principal, token_hmac)
        if info is None:
            return error, ERROR_TIMESTAMP
        now = self._now()
        if expiry_period_ms < 0:
            self.remove(info.token_id)
            return ErrorCode.NONE, now
        if info.expired(now):
            return ErrorCode.DELEGATION_TOKEN_EXPIRED, ERROR_TIMESTAMP
        expiry = min(info.max_timestamp, now + expiry_period_ms)
        self._update(replace(info, expiry_timestamp=expiry))
        return ErrorCode.NONE, expiry

    def describe(self, principal: KafkaPrincipal, owners: list[KafkaPrincipal] | None,
                 may_describe_token: Callable[[str], bool],
                 may_describe_owner: Callable[[KafkaPrincipal], bool]) -> list[DelegationToken]:
        """Kafka's ``filterToken``: the tokens of ``owners`` (all when None) the principal
        owns, renews or requested, or may DESCRIBE (the DelegationToken resource) or
        DESCRIBE_TOKENS (the owner's User resource)."""
        out = []
        for info in sorted(self.tokens(), key=lambda t: (t.issue_timestamp, t.token_id)):
            if owners is not None and not any(info.owner_or_renewer(o) for o in owners):
                continue
            if (info.owner_or_renewer(principal) or may_describe_token(info.token_id)
                    or may_describe_owner(info.owner)):
                out.append(DelegationToken(info, self.hmac(info.token_id)))
        return out

    # -- expiry

    def expire_tokens(self) -> list[str]:
        """Removes every token past its expiry or max timestamp (Kafka's ``expireTokens``)."""
        now = self._now()
        gone = [t for t in self.tokens() if t.expired(now)]
        for info in gone:
            log.info("Delegation token expired for token: %s for owner: %s", info.token_id,
                     info.owner)
            self.remove(info.token_id)
        return [t.token_id for t in gone]

    def _check_expiry(self) -> None:
        while not self._stop.wait(self.config.expiry_check_interval_ms / 1000):
            try:
                self.expire_tokens()
            except Exception:  # noqa: BLE001 - tried again at the next interval
                log.exception("removing expired delegation tokens failed")

    # -- authentication

    def token_credential(self, token_id: str, mechanism: str
                         ) -> tuple[ScramCredential, KafkaPrincipal, int] | None:
        """(SCRAM credential, owner, expiry timestamp) of a ``tokenauth`` login with
        ``token_id``, or None when no unexpired token has that id."""
        with self._lock:
            info = self._tokens.get(token_id)
            credential = self._scram.get((token_id, mechanism))
        if info is None or info.expired(self._now()):
            return None
        if credential is None:
            mech = MECHANISMS[mechanism]
            password = base64.b64encode(self.hmac(token_id)).decode("ascii")
            credential = ScramFormatter(mech).generate_credential(password, mech.min_iterations)
            with self._lock:
                if token_id in self._tokens:
                    credential = self._scram.setdefault((token_id, mechanism), credential)
        return credential, info.owner, info.expiry_timestamp
