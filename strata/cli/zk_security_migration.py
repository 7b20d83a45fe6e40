"""``strata zookeeper-security-migration``: Kafka's ``zookeeper-security-migration.sh``
(ZkSecurityMigrator), which sets Kafka's ACLs on the cluster's existing znodes when
``zookeeper.set.acl`` is turned on (``--zookeeper.acl=secure``) or off (``unsecure``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from strata.common.config import load_properties

TLS_CONFIG_FILE = "zk-tls-config-file"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--zookeeper.acl", dest="acl", required=True, choices=("secure", "unsecure"),
                   help="make the Kafka znodes secure or unsecure")
    p.add_argument("--zookeeper.connect", dest="connect", default="localhost:2181",
                   help="host:port[,host:port][/chroot] (the brokers' zookeeper.connect)")
    p.add_argument("--zookeeper.session.timeout", dest="session_timeout", type=int, default=30000)
    p.add_argument("--zookeeper.connection.timeout", dest="connection_timeout", type=int,
                   default=30000)
    p.add_argument("--enable.path.check", dest="path_check", action="store_true",
                   help="exit without changes when a secure root path does not exist")
    p.add_argument(f"--{TLS_CONFIG_FILE}", dest="tls_config", default=None,
                   help="a properties file with the zookeeper.ssl.* client settings (other "
                        "keys are ignored)")
    p.set_defaults(fn=run)


def run(args: argparse.Namespace) -> int:
    from strata.cluster.zk.client import SECURE_ROOT_PATHS, StrataZkClient
    from strata.cluster.zk.config import ZkClientConfig, ZkConfigError
    props = {"zookeeper.connect": args.connect,
             "zookeeper.session.timeout.ms": str(args.session_timeout),
             "zookeeper.connection.timeout.ms": str(args.connection_timeout)}
    if args.tls_config:
        props.update({k: v for k, v in load_properties(Path(args.tls_config).read_text()).items()
                      if k.startswith("zookeeper.ssl.") or k == "zookeeper.clientCnxnSocket"})
    try:
        config = ZkClientConfig.from_properties(props)
    except ZkConfigError as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return 1
    assert config is not None
    if config.sasl is None and config.tls is None:
        print("ERROR: No JAAS configuration file has been specified and no TLS client "
              "certificate has been specified. Set java.security.auth.login.config (in "
              f"KAFKA_OPTS, as -D...) or give --{TLS_CONFIG_FILE} with "
              "zookeeper.ssl.client.enable and zookeeper.ssl.keystore.location",
              file=sys.stderr)
        return 1
    with StrataZkClient(config) as zk:
        missing = [p for p in SECURE_ROOT_PATHS if not zk.path_exists(p)]
        if missing:
            print(f"Warning: The following secure root paths do not exist in ZooKeeper: "
                  f"{','.join(missing)}")
            print("That might be due to an incorrect chroot is specified when executing the "
                  "command.")
            if args.path_check:
                print("Exit the command.")
                return 1
        changed = zk.set_default_acls(args.acl == "secure")
    print(f"Set {args.acl} ACLs on {changed} znodes")
    return 0
