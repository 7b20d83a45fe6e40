"""``StrataZkClient``: the one class that talks to ZooKeeper (through kazoo), as Kafka's
``KafkaZkClient`` does for a ZooKeeper-mode broker and controller.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping, Sequence

from kazoo.client import KazooClient, KazooState, TransactionRequest
from kazoo.exceptions import (
    AuthFailedError, BadVersionError, ConnectionLoss, NodeExistsError, NoNodeError, OperationTimeoutError,
    RolledBackError, RuntimeInconsistency, SessionExpiredError)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.recipe.cache import TreeCache, TreeEvent
from kazoo.recipe.watchers import ChildrenWatch, DataWatch
from kazoo.retry import KazooRetry
from kazoo.security import ACL, CREATOR_ALL_ACL, OPEN_ACL_UNSAFE, READ_ACL_UNSAFE

from strata.cluster.image import BrokerRegistration, PartitionRegistration
from strata.cluster.zk import znodes as z
from strata.cluster.zk.config import ZkClientConfig, ZkConfigError, ZkTlsConfig
from strata.cluster.zk.session_lease import ZkSessionLease
from strata.common.types import TopicPartition

log = logging.getLogger(__name__)

CONFIG_CHANGE_EXPIRATION_MS = 15 * 60 * 1000  # ZkNodeChangeNotificationListener's changeExpirationMs
_RETRYABLE = (ConnectionLoss, OperationTimeoutError, SessionExpiredError)
_ABORTED = (RolledBackError, RuntimeInconsistency)  # other ops of a failed multi


class ZooKeeperError(Exception):
    """A ZooKeeper operation failed (kazoo's exception is the ``__cause__``)."""


class ZkNodeExistsError(ZooKeeperError):
    """The znode to create exists: a topic, a deletion mark, another session's registration."""


class ControllerMovedError(ZooKeeperError):
    """Kafka's ControllerMovedException: the controller epoch znode moved past this controller."""


class ZkConnectionTimeoutError(ZooKeeperError):
    """No connection within ``zookeeper.connection.timeout.ms``."""


@dataclass(frozen=True)
class StateChangeHandler:
    """Kafka's ``StateChangeHandler``: called around the start of each new session after
    the previous one expired (a broker re-registers in ``after_initializing_session``)."""

    name: str
    before_initializing_session: Callable[[], None] = lambda: None
    after_initializing_session: Callable[[], None] = lambda: None


@dataclass(frozen=True)
class UpdateLeaderAndIsrResult:
    """Per partition, the state as written (``partition_epoch`` = the new znode version) or
    the error; ``to_retry`` lost a version race (the state was changed since it was read)."""

    finished: Mapping[TopicPartition, PartitionRegistration | ZooKeeperError]
    to_retry: Sequence[TopicPartition] = field(default_factory=tuple)


# ZkData.SensitiveRootPaths: with zookeeper.set.acl=true not even world-readable.
SENSITIVE_ROOT_PATHS = (f"{z.CONFIG_PATH}/users", f"{z.CONFIG_PATH}/brokers",
                        "/delegation_token/tokens")


# ZkData.SecureRootPaths (with ZkAclStore's paths) and Strata's own root: what
# zookeeper-security-migration walks.
SECURE_ROOT_PATHS = (z.ADMIN_PATH, z.BROKERS_PATH, "/cluster", z.CONFIG_PATH, z.CONTROLLER_PATH,
                     z.CONTROLLER_EPOCH_PATH, z.ISR_CHANGE_NOTIFICATION_PATH,
                     z.PRODUCER_ID_BLOCK_PATH, z.LOG_DIR_EVENT_NOTIFICATION_PATH,
                     "/delegation_token", "/kafka-acl-extended", "/migration", "/feature",
                     "/kafka-acl", "/kafka-acl-changes", "/kafka-acl-extended-changes", "/strata")


def default_acls(secure: bool, path: str) -> list[ACL]:
    """Kafka's ``ZkData.defaultAcls``: with ``zookeeper.set.acl`` the creator (the broker's
    SASL or x509 identity) gets ALL and everyone READ, except on sensitive paths; the old
    consumers' path stays open, as everything does without it."""
    if not secure or path == z.CONSUMERS_PATH:
        return list(OPEN_ACL_UNSAFE)
    acls = list(CREATOR_ALL_ACL)
    if not path.startswith(SENSITIVE_ROOT_PATHS):
        acls += READ_ACL_UNSAFE
    return acls


class _AclTransaction(TransactionRequest):
    def create(self, path, value=b"", acl=None, ephemeral=False, sequence=False):
        if acl is None:
            acl = self.client.acls_for(path)
        return super().create(path, value, acl, ephemeral, sequence)


class _AclKazooClient(KazooClient):
    """Every create without explicit ACLs (``create``, ``ensure_path`` and its parents, a
    multi's creates) gets ``default_acls`` of its own chroot-relative path; a ``create`` with
    ``makepath`` makes the missing parents with theirs first."""

    def __init__(self, *args: Any, set_acl: bool = False, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.set_acl = set_acl

    def acls_for(self, path: str) -> list[ACL]:
        return default_acls(self.set_acl, path)

    def create(self, path, value=b"", acl=None, ephemeral=False, sequence=False,
               makepath=False, include_data=False):
        if makepath and acl is None:
            try:
                return super().create(path, value, None, ephemeral, sequence, False, include_data)
            except NoNodeError:
                self.ensure_path(path.rstrip("/").rsplit("/", 1)[0] or "/")
        return super().create(path, value, acl, ephemeral, sequence, makepath, include_data)

    def create_async(self, path, value=b"", acl=None, ephemeral=False, sequence=False,
                     makepath=False, include_data=False):
        if acl is None:
            acl = self.acls_for(path)
        return super().create_async(path, value, acl, ephemeral, sequence, makepath,
                                    include_data)

    def transaction(self):
        return _AclTransaction(self)


def _pem_files(tls: ZkTlsConfig, directory: str) -> dict[str, Any]:
    """kazoo's ``keyfile``/``certfile``/``ca`` from the ``zookeeper.ssl.*`` stores (PKCS12 or
    PEM; Kafka's JKS is not readable here), written to ``directory``."""
    from cryptography.hazmat.primitives.serialization import (
        Encoding, NoEncryption, PrivateFormat, pkcs12)

    def kind(store_type: str | None, location: str) -> str:
        t = (store_type or "").upper()
        if t in ("", "PKCS12", "PEM"):
            return t or ("PEM" if location.endswith((".pem", ".crt")) else "PKCS12")
        raise ZkConfigError(f"zookeeper.ssl keystore type {store_type} is not supported "
                            f"(PKCS12 or PEM)")

    def write(name: str, data: bytes) -> str:
        path = os.path.join(directory, name)
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
            f.write(data)
        return path

    out: dict[str, Any] = {}
    if tls.keystore_location:
        if kind(tls.keystore_type, tls.keystore_location) == "PEM":
            out["certfile"] = out["keyfile"] = tls.keystore_location
            out["keyfile_password"] = tls.keystore_password
        else:
            key, cert, extra = pkcs12.load_key_and_certificates(
                open(tls.keystore_location, "rb").read(),
                tls.keystore_password.encode() if tls.keystore_password else None)
            out["keyfile"] = write("key.pem", key.private_bytes(
                Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
            out["certfile"] = write("chain.pem", b"".join(
                c.public_bytes(Encoding.PEM) for c in [cert, *extra]))
    if tls.truststore_location:
        if kind(tls.truststore_type, tls.truststore_location) == "PEM":
            out["ca"] = tls.truststore_location
        else:
            _, cert, extra = pkcs12.load_key_and_certificates(
                open(tls.truststore_location, "rb").read(),
                tls.truststore_password.encode() if tls.truststore_password else None)
            out["ca"] = write("ca.pem", b"".join(
                c.public_bytes(Encoding.PEM) for c in [*([cert] if cert else []), *extra]))
    return out


def _error(exc: BaseException, what: str) -> ZooKeeperError:
    kind = ZkNodeExistsError if isinstance(exc, NodeExistsError) else ZooKeeperError
    err = kind(f"{what}: {type(exc).__name__}")
    err.__cause__ = exc
    return err


class StrataZkClient:
    """Kafka's ZooKeeper-mode layout (``znodes``) read and written under the chroot of
    ``zookeeper.connect``, which ``start()`` creates when missing.

    Invariants: every write a controller makes (partition states, topic znodes, deletion marks,
    ``/controller``) is a multi-op whose first op checks ``/controller_epoch``'s zkVersion, so a
    controller that has been succeeded changes nothing (``ControllerMovedError``); partition
    states are also conditional on their own zkVersion. Requests retry through connection
    loss and session expiry until they succeed or the client is closed, as Kafka's
    ``retryRequestUntilConnected``.

    Threads: any thread may call any method. Watch callbacks run on kazoo's event thread and
    state-change handlers on this client's one session thread, in order; both should only hand
    work off (e.g. enqueue a controller event), not block.
    """

    def __init__(self, config: ZkClientConfig):
        self.config = config
        self._tls_dir: str | None = None
        self._zk = self._kazoo(config.connect)
        self._retry = KazooRetry(max_tries=-1, delay=0.05, max_delay=1.0, ignore_expire=True,
                                 interrupt=lambda: self._closed)
        self._closed = False
        self._session_lost = False
        self._lost_generation = 0
        self._registered_session_id: int | None = None  # KafkaZkClient.currentZooKeeperSessionId
        self._handlers: dict[str, StateChangeHandler] = {}
        self._lock = threading.Lock()
        self._session_events = ThreadPoolExecutor(1, thread_name_prefix="zk-session")
        # whether this broker may act as a leader now (strata.common.leadership_lease)
        self.leadership_lease = ZkSessionLease(notify=self._session_events.submit)
        self._zk.add_listener(self._on_state)

    # --- session -------------------------------------------------------------------------

    def start(self) -> "StrataZkClient":
        timeout = self.config.effective_connection_timeout_ms / 1000
        if self.config.chroot:
            root = self._kazoo(self.config.hosts)
            self._start(root, timeout)
            try:
                root.ensure_path(self.config.chroot)
            finally:
                root.stop()
                root.close()
        self._start(self._zk, timeout)
        return self

    def _kazoo(self, hosts: str) -> KazooClient:
        """A kazoo client with this config's SASL, TLS and ACLs."""
        config = self.config
        options: dict[str, Any] = {}
        if config.sasl is not None:
            options["sasl_options"] = {"mechanism": "DIGEST-MD5", "username": config.sasl.username,
                                       "password": config.sasl.password}
        if config.tls is not None:
            if self._tls_dir is None:
                self._tls_dir = tempfile.mkdtemp(prefix="strata-zk-tls-")
            options.update(_pem_files(config.tls, self._tls_dir), use_ssl=True,
                           verify_certs=True,
                           check_hostname=config.tls.endpoint_identification)
        return _AclKazooClient(hosts=hosts, timeout=config.session_timeout_ms / 1000,
                               set_acl=config.set_acl, **options)

    def _start(self, zk: KazooClient, timeout: float) -> None:
        try:
            zk.start(timeout=timeout)
            zk.exists("/")   # a failed SASL login shows here if not in start()
        except KazooTimeoutError as e:
            zk.stop()
            raise ZkConnectionTimeoutError(
                f"Timed out waiting for connection to {self.config.hosts} after {timeout:g} s") from e
        except AuthFailedError as e:
            zk.stop()
            raise ZooKeeperError(
                f"Authentication to ZooKeeper at {self.config.hosts} failed"
                + (f" (SASL DIGEST-MD5 as {self.config.sasl.username!r})" if self.config.sasl
                   else "")) from e

    def close(self) -> None:
        self._closed = True
        self.leadership_lease.close()
        self._zk.stop()
        self._zk.close()
        self._session_events.shutdown(wait=True)
        if self._tls_dir is not None:
            shutil.rmtree(self._tls_dir, ignore_errors=True)

    def __enter__(self) -> "StrataZkClient":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def session_id(self) -> int | None:
        client_id = self._zk.client_id
        return client_id[0] if client_id else None

    @property
    def session_credentials(self) -> tuple[int, bytes] | None:
        """(session id, password): what another connection needs to take over this session."""
        return self._zk.client_id

    @property
    def connected(self) -> bool:
        return self._zk.state == KazooState.CONNECTED

    def register_state_change_handler(self, handler: StateChangeHandler) -> None:
        with self._lock:
            self._handlers[handler.name] = handler

    def unregister_state_change_handler(self, name: str) -> None:
        with self._lock:
            self._handlers.pop(name, None)

    def _on_state(self, state: str) -> None:
        # kazoo's connection thread: never block here.
        if self._closed:
            return
        if state == KazooState.LOST:
            self._session_lost = True
            log.warning("ZooKeeper session expired")
            self._lost_generation = self.leadership_lease.expired()
            self._session_events.submit(self._run_handlers, "before_initializing_session")
        elif state == KazooState.SUSPENDED:
            self.leadership_lease.suspended()
        elif state == KazooState.CONNECTED:
            self.leadership_lease.connected()
            if self._session_lost:
                self._session_lost = False
                log.info("ZooKeeper session re-established (0x%x)", self.session_id or 0)
                self._session_events.submit(self._initialize_session, self._lost_generation)

    def _initialize_session(self, lost_generation: int) -> None:
        if self._run_handlers("after_initializing_session"):
            self.leadership_lease.session_initialized(lost_generation)
        else:
            log.error("a state change handler failed on the new ZooKeeper session: the "
                      "leadership lease stays in doubt")

    def _run_handlers(self, phase: str) -> bool:
        """Runs every handler's ``phase``; True when none raised."""
        with self._lock:
            handlers = list(self._handlers.values())
        ok = True
        for handler in handlers:
            try:
                getattr(handler, phase)()
            except Exception:
                ok = False
                log.exception("state change handler %s failed in %s", handler.name, phase)
        return ok

    # --- request plumbing ----------------------------------------------------------------

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self._retry.copy()(fn, *args, **kwargs)

    def _commit(self, build: Callable[[TransactionRequest], None]) -> list[Any]:
        def run() -> list[Any]:
            tx = self._zk.transaction()
            build(tx)
            return tx.commit()
        return self._call(run)

    def _commit_many(self, builds: Sequence[Callable[[TransactionRequest], None]]) -> list[list[Any]]:
        """Pipelines one multi per build; one that hits a connection problem is redone alone."""
        pending = []
        for build in builds:
            tx = self._zk.transaction()
            build(tx)
            pending.append(tx.commit_async())
        results = []
        for build, result in zip(builds, pending):
            try:
                results.append(result.get())
            except _RETRYABLE:
                results.append(self._commit(build))
        return results

    def _fenced(self, expected_controller_epoch_zk_version: int,
                ops: Sequence[Callable[[TransactionRequest], None]]) -> list[Any]:
        """Each op in its own multi after a check of ``/controller_epoch``'s zkVersion; the
        ops' results (an exception instance for a failed op). Raises ControllerMovedError."""
        def with_check(op: Callable[[TransactionRequest], None]) -> Callable[[TransactionRequest], None]:
            def build(tx: TransactionRequest) -> None:
                tx.check(z.CONTROLLER_EPOCH_PATH, expected_controller_epoch_zk_version)
                op(tx)
            return build
        out = []
        for check, *rest in self._commit_many([with_check(op) for op in ops]):
            if isinstance(check, BadVersionError):
                raise ControllerMovedError(
                    "Controller epoch zkVersion check fails. Expected zkVersion = "
                    f"{expected_controller_epoch_zk_version}")
            if isinstance(check, Exception) and not isinstance(check, _ABORTED):
                raise _error(check, f"check of {z.CONTROLLER_EPOCH_PATH}")
            out.append(rest[0])
        return out

    def _get(self, path: str) -> tuple[bytes, Any] | None:
        try:
            return self._call(self._zk.get, path)
        except NoNodeError:
            return None

    def _get_many(self, paths: Sequence[str]) -> list[tuple[bytes, Any] | None]:
        pending = [self._zk.get_async(p) for p in paths]
        out = []
        for path, result in zip(paths, pending):
            try:
                out.append(result.get())
            except NoNodeError:
                out.append(None)
            except _RETRYABLE:
                out.append(self._get(path))
        return out

    def _children(self, path: str) -> list[str]:
        try:
            return self._call(self._zk.get_children, path)
        except NoNodeError:
            return []

    def _create(self, path: str, data: bytes = b"", *, sequence: bool = False,
                makepath: bool = True, ephemeral: bool = False) -> str:
        try:
            return self._call(self._zk.create, path, data, sequence=sequence, makepath=makepath,
                              ephemeral=ephemeral)
        except NodeExistsError as e:
            raise ZkNodeExistsError(f"{path} already exists") from e

    def make_sure_persistent_path_exists(self, path: str) -> None:
        self._call(self._zk.ensure_path, path)

    def create_top_level_paths(self) -> None:
        """ZkData.PersistentZkPaths, as every Kafka broker creates them at startup."""
        for path in z.PERSISTENT_PATHS:
            self.make_sure_persistent_path_exists(path)

    def set_default_acls(self, secure: bool) -> int:
        """Kafka's ZkSecurityMigrator: the chroot (or ``/``) and every znode under
        ``SECURE_ROOT_PATHS`` (made when missing, except ``/controller``) get
        ``default_acls(secure, path)``; the number of znodes changed. Needs ADMIN on them."""
        self._call(self._zk.set_acls, "/", default_acls(secure, "/"))  # not its children
        changed = 1
        pending = []
        for root in SECURE_ROOT_PATHS:
            if root == z.CONTROLLER_PATH and not self.path_exists(root):
                continue
            self.make_sure_persistent_path_exists(root)
            pending.append(root)
        while pending:
            path = pending.pop()
            try:
                self._call(self._zk.set_acls, path, default_acls(secure, path))
                changed += 1
                pending.extend(f"{path}/{c}" for c in self._call(self._zk.get_children, path))
            except NoNodeError:
                log.warning("znode %s is gone, it could have been legitimately deleted", path)
        return changed

    def path_exists(self, path: str) -> bool:
        return self._call(self._zk.exists, path) is not None

    # --- brokers ---------------------------------------------------------------------------

    def register_broker(self, broker: BrokerRegistration, **encode_args: Any) -> int:
        """Creates the ephemeral ``/brokers/ids/N``; returns the broker epoch (its czxid).

        A registration left by this client's own expired session is replaced (Kafka's
        KAFKA-7165 handling); one held by any other live session raises ZkNodeExistsError.
        """
        path = z.broker_path(broker.id)
        stat = self._checked_ephemeral_create(path, z.encode_broker(broker, **encode_args))
        log.info("Registered broker %d at path %s, czxid (broker epoch): %d",
                 broker.id, path, stat.czxid)
        return stat.czxid

    def _checked_ephemeral_create(self, path: str, data: bytes) -> Any:
        results = self._commit(lambda tx: (tx.create(path, b"", ephemeral=True),
                                           tx.set_data(path, data, 0)))
        if isinstance(results[0], NodeExistsError):
            stat = self._stat_after_node_exists(path, data)
        elif any(isinstance(r, Exception) for r in results):
            raise _error(next(r for r in results if not isinstance(r, _ABORTED)),
                         f"creating ephemeral {path}")
        else:
            stat = results[1]
        self._registered_session_id = self.session_id
        return stat

    def _stat_after_node_exists(self, path: str, data: bytes) -> Any:
        found = self._get(path)
        if found is None:
            log.info("The ephemeral node at %s went away while reading it, creating it again", path)
            return self._checked_ephemeral_create(path, data)
        owner = found[1].ephemeralOwner
        if owner == self._registered_session_id and owner != self.session_id:
            log.info("Ephemeral %s is owned by our expired session 0x%x; re-creating it", path, owner)
            try:
                self._call(self._zk.delete, path)
            except NoNodeError:
                pass
            return self._checked_ephemeral_create(path, data)
        if owner != self.session_id:
            raise ZkNodeExistsError(
                f"Error while creating ephemeral at {path}, node already exists and owner "
                f"'0x{owner:x}' does not match current session '0x{self.session_id or 0:x}'")
        return found[1]

    def get_broker(self, broker_id: int) -> BrokerRegistration | None:
        found = self._get(z.broker_path(broker_id))
        return None if found is None else z.decode_broker(broker_id, found[0], found[1].czxid)

    def get_sorted_broker_list(self) -> list[int]:
        return sorted(int(c) for c in self._children(z.BROKER_IDS_PATH))

    def get_all_brokers(self) -> list[BrokerRegistration]:
        """Every registered broker, by id, each with its epoch."""
        ids = self.get_sorted_broker_list()
        found = self._get_many([z.broker_path(i) for i in ids])
        return [z.decode_broker(i, f[0], f[1].czxid) for i, f in zip(ids, found) if f is not None]

    def watch_broker_ids(self, callback: Callable[[list[int]], None]) -> None:
        """Calls back with the sorted live broker ids now and after every change."""
        self._watch_children(z.BROKER_IDS_PATH, lambda ids: callback(sorted(int(i) for i in ids)))

    def request_controlled_shutdown(self, broker_id: int, broker_epoch: int) -> None:
        """Creates the ephemeral ``/admin/controlled_shutdown/N`` (gone with the session)."""
        path = f"{z.CONTROLLED_SHUTDOWN_PATH}/{broker_id}"
        try:
            self._create(path, str(broker_epoch).encode(), ephemeral=True)
        except ZkNodeExistsError:
            self._call(self._zk.set, path, str(broker_epoch).encode())

    def get_controlled_shutdowns(self) -> dict[int, int]:
        """Broker id -> broker epoch of every pending controlled shutdown request."""
        names = [c for c in self._children(z.CONTROLLED_SHUTDOWN_PATH) if c.isdigit()]
        found = self._get_many([f"{z.CONTROLLED_SHUTDOWN_PATH}/{n}" for n in names])
        return {int(n): int(f[0] or b"-1") for n, f in zip(names, found) if f is not None}

    def watch_controlled_shutdowns(self, callback: Callable[[list[str]], None]) -> None:
        self._watch_children(z.CONTROLLED_SHUTDOWN_PATH, callback)

    def get_all_broker_directories(self) -> dict[int, z.BrokerDirectories]:
        """Broker id -> what the controller last accepted of its registration (KIP-858)."""
        ids = [c for c in self._children(z.BROKER_DIRECTORIES_PATH) if c.isdigit()]
        found = self._get_many([z.broker_directories_path(int(i)) for i in ids])
        out = {}
        for i, f in zip(ids, found):
            if f is None:
                continue
            try:
                out[int(i)] = z.decode_broker_directories(f[0])
            except (ValueError, KeyError, TypeError) as exc:  # as if never handled
                log.error("ignoring unreadable %s: %s", z.broker_directories_path(int(i)), exc)
        return out

    def set_broker_directories(self, broker_id: int, value: z.BrokerDirectories,
                               expected_controller_epoch_zk_version: int) -> None:
        """Writes (or creates) ``/strata/broker_directories/N``, fenced by the controller epoch."""
        path, data = z.broker_directories_path(broker_id), z.encode_broker_directories(value)
        result, = self._fenced(expected_controller_epoch_zk_version,
                               [lambda tx: tx.set_data(path, data)])
        if isinstance(result, NoNodeError):
            self.make_sure_persistent_path_exists(z.BROKER_DIRECTORIES_PATH)
            result, = self._fenced(expected_controller_epoch_zk_version,
                                   [lambda tx: tx.create(path, data)])
        if isinstance(result, Exception):
            raise _error(result, f"writing {path}")

    # --- log dir events ------------------------------------------------------------------

    def report_replicas(self, base: str, broker_id: int, broker_epoch: int,
                        partitions: frozenset[TopicPartition], event: int) -> None:
        """A broker's own report: ``<base>/N`` (``z.OFFLINE_REPLICAS_PATH`` or
        ``z.TIER_BOOTSTRAPPED_PATH``) set to all its replicas of that kind, then a
        ``/log_dir_event_notification`` for the controller."""
        path = z.replica_report_path(base, broker_id)
        data = z.encode_replica_report(broker_epoch, partitions)
        try:
            self._call(self._zk.set, path, data)
        except NoNodeError:
            self.make_sure_persistent_path_exists(base)
            try:
                self._create(path, data)
            except ZkNodeExistsError:
                self._call(self._zk.set, path, data)
        self._create(f"{z.LOG_DIR_EVENT_NOTIFICATION_PATH}/{z.LOG_DIR_EVENT_PREFIX}",
                     z.encode_log_dir_event(broker_id, event), sequence=True)

    def get_all_reported(self, base: str) -> dict[int, tuple[int, frozenset[TopicPartition]]]:
        """Broker id -> (broker epoch, replicas) as each broker last reported under ``base``."""
        ids = [c for c in self._children(base) if c.isdigit()]
        found = self._get_many([z.replica_report_path(base, int(i)) for i in ids])
        out = {}
        for i, f in zip(ids, found):
            if f is None:
                continue
            try:
                out[int(i)] = z.decode_replica_report(f[0])
            except (ValueError, KeyError, TypeError) as exc:
                log.error("ignoring unreadable %s: %s", z.replica_report_path(base, int(i)), exc)
        return out

    def get_log_dir_event_notifications(self) -> list[str]:
        """The pending notifications' node names, oldest first."""
        return sorted(c for c in self._children(z.LOG_DIR_EVENT_NOTIFICATION_PATH)
                      if c.startswith(z.LOG_DIR_EVENT_PREFIX))

    def watch_log_dir_event_notifications(self, callback: Callable[[list[str]], None]) -> None:
        self._watch_children(z.LOG_DIR_EVENT_NOTIFICATION_PATH, callback)

    def delete_log_dir_event_notifications(self, names: Iterable[str],
                                           expected_controller_epoch_zk_version: int) -> None:
        self._delete_all([f"{z.LOG_DIR_EVENT_NOTIFICATION_PATH}/{n}" for n in names],
                         expected_controller_epoch_zk_version)

    # --- controller ----------------------------------------------------------------------

    def get_controller(self) -> z.ControllerRegistration | None:
        found = self._get(z.CONTROLLER_PATH)
        return None if found is None else z.ControllerRegistration.decode(found[0], found[1].version)

    def get_controller_id(self) -> int | None:
        controller = self.get_controller()
        return None if controller is None else controller.broker_id

    def get_controller_epoch(self) -> tuple[int, int] | None:
        """(epoch, zkVersion of ``/controller_epoch``), or None before the first controller."""
        found = self._get(z.CONTROLLER_EPOCH_PATH)
        return None if found is None else (z.decode_controller_epoch(found[0]), found[1].version)

    def watch_controller(self, callback: Callable[[int | None], None]) -> None:
        """Calls back with the controller's broker id (None without one) now and on change."""
        def on_data(data: bytes | None, _stat: Any) -> None:
            _guarded(z.CONTROLLER_PATH, callback,
                     z.ControllerRegistration.decode(data).broker_id if data else None)
        DataWatch(self._zk, z.CONTROLLER_PATH, on_data)

    def register_controller_and_increment_controller_epoch(
            self, controller_id: int, timestamp_ms: int | None = None) -> tuple[int, int]:
        """Creates ``/controller`` and bumps ``/controller_epoch`` in one multi-op conditional
        on the epoch's zkVersion; returns (new epoch, its zkVersion) or raises
        ControllerMovedError when another broker won."""
        current = self.get_controller_epoch() or self._maybe_create_controller_epoch()
        new_epoch, expected_version = current[0] + 1, current[1]
        registration = z.ControllerRegistration(
            controller_id, z.now_ms() if timestamp_ms is None else timestamp_ms)
        results = self._commit(lambda tx: (
            tx.create(z.CONTROLLER_PATH, registration.encode(), ephemeral=True),
            tx.set_data(z.CONTROLLER_EPOCH_PATH, z.encode_controller_epoch(new_epoch),
                        expected_version)))
        if not any(isinstance(r, Exception) for r in results):
            return new_epoch, results[1].version
        if any(isinstance(r, (NodeExistsError, BadVersionError)) for r in results):
            # Our own multi may have succeeded before a connection loss made it retry.
            if self.get_controller_id() == controller_id:
                epoch = self.get_controller_epoch()
                if epoch is not None and epoch[0] == new_epoch:
                    return epoch
            raise ControllerMovedError("Controller moved to another broker. "
                                       "Aborting controller startup procedure")
        raise _error(next(r for r in results if not isinstance(r, _ABORTED)), "controller election")

    def _maybe_create_controller_epoch(self) -> tuple[int, int]:
        try:
            self._create(z.CONTROLLER_EPOCH_PATH,
                         z.encode_controller_epoch(z.INITIAL_CONTROLLER_EPOCH), makepath=False)
            return z.INITIAL_CONTROLLER_EPOCH, z.INITIAL_CONTROLLER_EPOCH_ZK_VERSION
        except ZkNodeExistsError:
            current = self.get_controller_epoch()
            if current is None:
                raise ZooKeeperError(f"{z.CONTROLLER_EPOCH_PATH} existed before but goes away "
                                     "while trying to read it") from None
            return current

    def delete_controller(self, expected_controller_epoch_zk_version: int) -> None:
        """Resigns: deletes ``/controller`` (a no-op when it is gone)."""
        result, = self._fenced(expected_controller_epoch_zk_version,
                               [lambda tx: tx.delete(z.CONTROLLER_PATH)])
        if isinstance(result, Exception) and not isinstance(result, NoNodeError):
            raise _error(result, f"deleting {z.CONTROLLER_PATH}")

    # --- finalized features (strata.cluster.features) --------------------------------------

    def get_feature_znode(self) -> tuple[bytes, int] | None:
        """``/feature``'s data and zkVersion, or None when it does not exist."""
        found = self._get(z.FEATURE_PATH)
        return None if found is None else (found[0], found[1].version)

    def set_feature_znode(self, data: bytes, expected_version: int | None) -> int | None:
        """Writes ``/feature`` if its zkVersion is still ``expected_version`` (None: creates
        it); the new zkVersion, or None when another write came first."""
        try:
            if expected_version is None:
                self._call(self._zk.create, z.FEATURE_PATH, data, makepath=True)
                return 0
            return self._call(self._zk.set, z.FEATURE_PATH, data, expected_version).version
        except (BadVersionError, NodeExistsError, NoNodeError):
            return None

    def watch_feature_znode(self, callback: Callable[[bytes | None, int], None]) -> None:
        """Calls back with ``/feature``'s data and zkVersion now and on every change."""
        def on_data(data: bytes | None, stat: Any) -> None:
            _guarded(z.FEATURE_PATH, lambda _: callback(data, -1 if stat is None else stat.version),
                     None)
        DataWatch(self._zk, z.FEATURE_PATH, on_data)

    # --- topics and partition states -------------------------------------------------------

    def get_all_topics(self) -> set[str]:
        return set(self._children(z.TOPICS_PATH))

    def watch_topics(self, callback: Callable[[set[str]], None]) -> None:
        self._watch_children(z.TOPICS_PATH, lambda names: callback(set(names)))

    def watch_topic(self, topic: str, callback: Callable[[], None]) -> None:
        """Kafka's PartitionModificationsHandler: calls back now and whenever
        ``/brokers/topics/T``'s data changes; the watch ends when the znode is gone."""
        def on_data(data: bytes | None, _stat: Any) -> bool | None:
            if data is None:
                return False
            _guarded(z.topic_path(topic), lambda _: callback(), None)
            return None
        DataWatch(self._zk, z.topic_path(topic), on_data)

    def create_topic_assignment(self, assignment: z.TopicAssignment) -> None:
        """Creates ``/brokers/topics/T`` (AdminZkClient's path for a new topic); raises
        ZkNodeExistsError when the topic exists."""
        self._create(z.topic_path(assignment.topic), assignment.encode())

    def set_topic_assignment(self, assignment: z.TopicAssignment,
                             expected_controller_epoch_zk_version: int) -> int:
        """Rewrites ``/brokers/topics/T`` (conditional on ``assignment.zk_version`` when it is
        known); returns the new zkVersion."""
        result, = self._fenced(expected_controller_epoch_zk_version, [
            lambda tx: tx.set_data(z.topic_path(assignment.topic), assignment.encode(),
                                   assignment.zk_version)])
        if isinstance(result, Exception):
            raise _error(result, f"setting {z.topic_path(assignment.topic)}")
        return result.version

    def admin_set_topic_assignment(self, assignment: z.TopicAssignment) -> None:
        """AdminZkClient's rewrite of ``/brokers/topics/T`` (CreatePartitions from any broker):
        conditional on ``assignment.zk_version``; ZooKeeperError when it changed meanwhile."""
        try:
            self._call(self._zk.set, z.topic_path(assignment.topic), assignment.encode(),
                       assignment.zk_version)
        except (BadVersionError, NoNodeError) as e:
            raise _error(e, f"setting {z.topic_path(assignment.topic)}") from None

    def get_topic_assignments(self, topics: Iterable[str]) -> dict[str, z.TopicAssignment]:
        names = sorted(topics)
        found = self._get_many([z.topic_path(t) for t in names])
        return {t: z.TopicAssignment.decode(t, f[0], f[1].version)
                for t, f in zip(names, found) if f is not None}

    def get_partition_states(self, partitions: Iterable[TopicPartition]
                             ) -> dict[TopicPartition, PartitionRegistration]:
        """The state znodes that exist, each with its zkVersion as ``partition_epoch``."""
        tps = list(partitions)
        found = self._get_many([z.partition_state_path(tp.topic, tp.partition) for tp in tps])
        return {tp: z.decode_partition_state(f[0], f[1].version, f[1].mzxid)
                for tp, f in zip(tps, found) if f is not None}

    def create_partition_states(self, states: Mapping[TopicPartition, PartitionRegistration],
                                expected_controller_epoch_zk_version: int
                                ) -> dict[TopicPartition, PartitionRegistration | ZooKeeperError]:
        """Creates the state znodes (and their parents) of new partitions; per partition the
        state as created (``partition_epoch`` 0) or the error (ZkNodeExistsError if it exists)."""
        v = expected_controller_epoch_zk_version
        parents = sorted({z.partitions_path(tp.topic) for tp in states}) + sorted(
            {z.partition_path(tp.topic, tp.partition) for tp in states})
        for path, result in zip(parents, self._fenced(
                v, [lambda tx, p=p: tx.create(p, b"") for p in parents])):
            if isinstance(result, Exception) and not isinstance(result, NodeExistsError):
                raise _error(result, f"creating {path}")
        tps = list(states)
        results = self._fenced(v, [
            lambda tx, tp=tp: tx.create(z.partition_state_path(tp.topic, tp.partition),
                                        z.encode_partition_state(states[tp]))
            for tp in tps])
        return {tp: _error(r, f"creating state of {tp}") if isinstance(r, Exception)
                else replace(states[tp], partition_epoch=0)
                for tp, r in zip(tps, results)}

    def update_leader_and_isr(self, states: Mapping[TopicPartition, PartitionRegistration],
                              controller_epoch: int, expected_controller_epoch_zk_version: int
                              ) -> UpdateLeaderAndIsrResult:
        """Writes each new state stamped with ``controller_epoch``, conditional on its
        ``partition_epoch`` (the zkVersion it was read at) and on the controller epoch
        znode's zkVersion. Raises ControllerMovedError when this controller is stale."""
        tps = list(states)
        stamped = {tp: replace(states[tp], controller_epoch=controller_epoch) for tp in tps}
        results = self._fenced(expected_controller_epoch_zk_version, [
            lambda tx, tp=tp: tx.set_data(z.partition_state_path(tp.topic, tp.partition),
                                          z.encode_partition_state(stamped[tp]),
                                          stamped[tp].partition_epoch)
            for tp in tps])
        finished: dict[TopicPartition, PartitionRegistration | ZooKeeperError] = {}
        to_retry = []
        for tp, result in zip(tps, results):
            if isinstance(result, BadVersionError):
                to_retry.append(tp)
            elif isinstance(result, Exception):
                finished[tp] = _error(result, f"updating state of {tp}")
            else:
                finished[tp] = replace(stamped[tp], partition_epoch=result.version)
        return UpdateLeaderAndIsrResult(finished, tuple(to_retry))

    # --- topic deletion ------------------------------------------------------------------

    def create_delete_topic_path(self, topic: str) -> None:
        """Marks the topic for deletion; ZkNodeExistsError when it already is."""
        self._create(z.delete_topic_path(topic))

    def is_topic_marked_for_deletion(self, topic: str) -> bool:
        return self.path_exists(z.delete_topic_path(topic))

    def get_topic_deletions(self) -> list[str]:
        return sorted(self._children(z.DELETE_TOPICS_PATH))

    def watch_topic_deletions(self, callback: Callable[[list[str]], None]) -> None:
        self._watch_children(z.DELETE_TOPICS_PATH, lambda names: callback(sorted(names)))

    def delete_topic_deletions(self, topics: Iterable[str],
                               expected_controller_epoch_zk_version: int) -> None:
        self._delete_all([z.delete_topic_path(t) for t in topics],
                         expected_controller_epoch_zk_version)

    def delete_topic_znode(self, topic: str, expected_controller_epoch_zk_version: int) -> None:
        """Deletes ``/brokers/topics/T`` and everything under it, in one fenced multi."""
        self._delete_tree(z.topic_path(topic), expected_controller_epoch_zk_version)

    def delete_topic_configs(self, topics: Iterable[str],
                             expected_controller_epoch_zk_version: int) -> None:
        self._delete_all([z.config_entity_path("topics", t) for t in topics],
                         expected_controller_epoch_zk_version)

    def _delete_all(self, paths: Sequence[str], expected_controller_epoch_zk_version: int) -> None:
        for path, result in zip(paths, self._fenced(
                expected_controller_epoch_zk_version,
                [lambda tx, p=p: tx.delete(p) for p in paths])):
            if isinstance(result, Exception) and not isinstance(result, NoNodeError):
                raise _error(result, f"deleting {path}")

    def _delete_tree(self, root: str, expected_controller_epoch_zk_version: int) -> None:
        for _ in range(10):  # children may appear between the listing and the delete
            order = self._subtree_leaves_first(root)
            if not order:
                return
            def build(tx: TransactionRequest) -> None:
                tx.check(z.CONTROLLER_EPOCH_PATH, expected_controller_epoch_zk_version)
                for path in order:
                    tx.delete(path)
            results = self._commit(build)
            if isinstance(results[0], BadVersionError):
                raise ControllerMovedError(f"Controller epoch zkVersion check fails while "
                                           f"deleting {root}")
            if not any(isinstance(r, Exception) for r in results):
                return
        raise ZooKeeperError(f"could not delete {root}: its children keep changing")

    def _subtree_leaves_first(self, path: str) -> list[str]:
        try:
            children = self._call(self._zk.get_children, path)
        except NoNodeError:
            return []
        out: list[str] = []
        for child in children:
            out += self._subtree_leaves_first(f"{path}/{child}")
        return out + [path]

    # --- configs -----------------------------------------------------------------------

    def get_entity_configs(self, entity_type: str, entity_name: str) -> dict[str, str]:
        found = self._get(z.config_entity_path(entity_type, entity_name))
        return {} if found is None else z.decode_entity_config(found[0])

    def get_all_entities_with_config(self, entity_type: str) -> list[str]:
        return sorted(self._children(f"{z.CONFIG_PATH}/{entity_type}"))

    def set_or_create_entity_configs(self, entity_type: str, entity_name: str,
                                     config: Mapping[str, str]) -> None:
        """Writes ``/config/<type>/<name>`` whole (last writer wins, as in Kafka)."""
        path, data = z.config_entity_path(entity_type, entity_name), z.encode_entity_config(config)
        try:
            self._call(self._zk.set, path, data)
        except NoNodeError:
            try:
                self._create(path, data)
            except ZkNodeExistsError:
                self._call(self._zk.set, path, data)

    def update_entity_configs(self, entity_type: str, entity_name: str,
                              update: Callable[[dict[str, str]], dict[str, str]]) -> dict[str, str]:
        """Rewrites ``/config/<type>/<name>`` as ``update`` makes its current configs, against
        the version read (a concurrent writer's change is read again and kept, not lost), then
        appends its change notification; returns what was written."""
        path = z.config_entity_path(entity_type, entity_name)
        for _ in range(100):
            found = self._get(path)
            config = update({} if found is None else z.decode_entity_config(found[0]))
            data = z.encode_entity_config(config)
            try:
                if found is None:
                    self._create(path, data)
                else:
                    self._call(self._zk.set, path, data, version=found[1].version)
            except (ZkNodeExistsError, BadVersionError, NoNodeError):
                continue
            self.create_config_change_notification(f"{entity_type}/{entity_name}")
            return config
        raise ZooKeeperError(f"could not update {path}: it keeps changing")

    def create_config_change_notification(self, entity_path: str) -> str:
        """Appends ``/config/changes/config_change_<seq>`` for ``entity_path`` (``topics/T``,
        ``brokers/<default>``, ``brokers/1``); returns the node's name."""
        path = self._create(f"{z.CONFIG_CHANGES_PATH}/{z.CONFIG_CHANGE_PREFIX}",
                            z.encode_config_change(entity_path), sequence=True)
        return path.rsplit("/", 1)[1]

    def change_entity_config(self, entity_type: str, entity_name: str,
                             config: Mapping[str, str]) -> None:
        """AdminZkClient.changeConfigs: the config znode, then its change notification;
        notifications older than Kafka's 15 minutes go (brokers read the config znodes)."""
        self.set_or_create_entity_configs(entity_type, entity_name, config)
        self.create_config_change_notification(f"{entity_type}/{entity_name}")
        self.purge_config_change_notifications(z.now_ms() - CONFIG_CHANGE_EXPIRATION_MS)

    def purge_config_change_notifications(self, created_before_ms: int) -> None:
        names = [c for c in self._children(z.CONFIG_CHANGES_PATH) if c.startswith(z.CONFIG_CHANGE_PREFIX)]
        found = self._get_many([f"{z.CONFIG_CHANGES_PATH}/{n}" for n in names])
        self.delete_config_change_notifications(
            n for n, f in zip(names, found) if f is not None and f[1].ctime < created_before_ms)

    def get_config_change_notifications(self) -> list[tuple[str, str]]:
        """(node name, entity path) of each pending notification, oldest first."""
        names = sorted(c for c in self._children(z.CONFIG_CHANGES_PATH)
                       if c.startswith(z.CONFIG_CHANGE_PREFIX))
        found = self._get_many([f"{z.CONFIG_CHANGES_PATH}/{n}" for n in names])
        return [(n, z.decode_config_change(f[0])) for n, f in zip(names, found) if f is not None]

    def watch_config_changes(self, callback: Callable[[list[str]], None]) -> None:
        """Calls back with the sorted notification node names now and after every change."""
        self._watch_children(z.CONFIG_CHANGES_PATH, lambda names: callback(sorted(names)))

    def delete_config_change_notifications(self, names: Iterable[str]) -> None:
        for name in names:
            try:
                self._call(self._zk.delete, f"{z.CONFIG_CHANGES_PATH}/{name}")
            except NoNodeError:
                pass

    # --- cluster-wide singletons -----------------------------------------------------------

    def get_cluster_id(self) -> str | None:
        found = self._get(z.CLUSTER_ID_PATH)
        return None if found is None else z.decode_cluster_id(found[0])

    def create_or_get_cluster_id(self, proposed: str) -> str:
        """The cluster id: ``proposed`` if this call created ``/cluster/id``, else the stored one."""
        try:
            self._create(z.CLUSTER_ID_PATH, z.encode_cluster_id(proposed))
            return proposed
        except ZkNodeExistsError:
            stored = self.get_cluster_id()
            if stored is None:
                raise ZooKeeperError("Failed to get cluster id from Zookeeper. This can happen "
                                     "if /cluster/id is deleted from Zookeeper.") from None
            return stored

    def allocate_producer_id_block(self, broker_id: int) -> z.ProducerIdsBlock:
        """Kafka's ZkProducerIdManager.getNewProducerIdBlock: reads the latest block and
        writes the next one conditional on the znode's version, retrying on a lost race."""
        while True:
            found = self._get(z.PRODUCER_ID_BLOCK_PATH)
            if found is None:
                self.make_sure_persistent_path_exists(z.PRODUCER_ID_BLOCK_PATH)
                continue
            data, stat = found
            if data:
                current = z.ProducerIdsBlock.decode(data)
                if current.last_producer_id > z.INT64_MAX - z.PRODUCER_ID_BLOCK_SIZE:
                    raise ZooKeeperError("Have exhausted all producerIds.")
                block = z.ProducerIdsBlock(broker_id, current.next_block_first_id,
                                           z.PRODUCER_ID_BLOCK_SIZE)
            else:
                block = z.ProducerIdsBlock(broker_id, 0, z.PRODUCER_ID_BLOCK_SIZE)
            try:
                self._call(self._zk.set, z.PRODUCER_ID_BLOCK_PATH, block.encode(), stat.version)
            except BadVersionError:
                continue
            log.info("Acquired new producerId block %s (znode version %d)", block, stat.version)
            return block

    # --- plain znodes (ACLs: strata.cluster.acl_store) ---------------------------------------

    def get_data(self, path: str) -> tuple[bytes, Any] | None:
        """(data, stat) of ``path``, or None if it does not exist."""
        return self._get(path)

    def get_data_many(self, paths: Sequence[str]) -> list[tuple[bytes, Any] | None]:
        return self._get_many(paths)

    def get_children(self, path: str) -> list[str]:
        """``path``'s children (none if it does not exist)."""
        return self._children(path)

    def create_znode(self, path: str, data: bytes, *, sequence: bool = False) -> str:
        """Creates ``path`` (and missing parents); ZkNodeExistsError if it is there."""
        return self._create(path, data, sequence=sequence)

    def set_data_if(self, path: str, data: bytes, version: int) -> bool:
        """Sets ``path`` if its version is still ``version``; False if it changed or went."""
        try:
            self._call(self._zk.set, path, data, version=version)
            return True
        except (BadVersionError, NoNodeError):
            return False

    def delete_if(self, path: str, version: int) -> bool:
        """Deletes ``path`` if its version is still ``version``; False if it changed or went."""
        try:
            self._call(self._zk.delete, path, version=version)
            return True
        except (BadVersionError, NoNodeError):
            return False

    def watch_children(self, path: str, callback: Callable[[list[str]], None]) -> None:
        """Calls back (on kazoo's thread) with ``path``'s children now and after each change."""
        self._watch_children(path, callback)

    # --- watches -------------------------------------------------------------------------

    def _watch_children(self, path: str, callback: Callable[[list[str]], None]) -> None:
        self.make_sure_persistent_path_exists(path)
        ChildrenWatch(self._zk, path, lambda children: _guarded(path, callback, children))


    def tree(self, path: str, on_change: Callable[[], None]) -> "ZkTree":
        """A live in-memory copy of the subtree at ``path`` (kazoo's TreeCache: a data and a
        children watch per znode, refreshed after reconnection and session expiry);
        ``on_change`` is called on kazoo's thread after every change it applies."""
        self.make_sure_persistent_path_exists(path)
        return ZkTree(self._zk, path, on_change)


class ZkTree:
    """Read side of ``StrataZkClient.tree``: ``data``/``children`` answer from memory.

    ``initialized`` turns true once the whole subtree has been read, false again when the
    session is lost, until it has been read anew.
    """

    def __init__(self, zk: KazooClient, path: str, on_change: Callable[[], None]):
        self.path = path
        self.initialized = False
        self._on_change = on_change
        self._cache = TreeCache(zk, path)
        self._cache.listen(self._event)
        self._cache.listen_fault(lambda e: log.error("tree cache of %s failed: %r", path, e))
        self._cache.start()

    def _event(self, event: Any) -> None:
        if event.event_type == TreeEvent.INITIALIZED:
            self.initialized = True
        elif event.event_type == TreeEvent.CONNECTION_LOST:
            self.initialized = False
        _guarded(self.path, lambda _: self._on_change(), None)

    def data(self, path: str) -> tuple[bytes, Any] | None:
        """(data, stat) of the cached znode, or None."""
        found = self._cache.get_data(path)
        return None if found is None else (found.data, found.stat)

    def children(self, path: str) -> list[str]:
        return sorted(self._cache.get_children(path) or ())

    def close(self) -> None:
        self._cache.close()


def _guarded(path: str, callback: Callable[[Any], None], value: Any) -> None:
    """Runs a watch callback; an exception is logged (raising would end kazoo's watch)."""
    try:
        callback(value)
    except Exception:
        log.exception("watch callback for %s failed", path)

