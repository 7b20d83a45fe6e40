"""Fixtures of tests against one real ZooKeeper per module: the server, a fresh chroot per test,
and started ``StrataZkClient``s of that chroot. A module takes them with
``from zk_fixtures import chroot, new_client, zk_server  # noqa: F401``."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest
from zk_server import ZooKeeperServer

from strata.cluster.zk.client import StrataZkClient
from strata.cluster.zk.config import ZkClientConfig

SESSION_MS = 4000


@pytest.fixture(scope="module")
def zk_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    with ZooKeeperServer(tmp_path_factory.mktemp("zk")) as server:
        yield server


@pytest.fixture
def chroot() -> str:
    return f"/strata-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def new_client(zk_server: ZooKeeperServer, chroot: str) -> Iterator[Callable[[], StrataZkClient]]:
    """Makes started clients of one chroot (each with its own session), all closed at the end."""
    made: list[StrataZkClient] = []

    def new() -> StrataZkClient:
        client = StrataZkClient(ZkClientConfig(zk_server.connect_string(chroot), SESSION_MS))
        made.append(client)
        return client.start()
    yield new
    for client in made:
        client.close()
