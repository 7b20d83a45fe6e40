"""The cluster metadata of a handler test that asks nothing of it but what every handler reads
or the context writes: no topic is a remote read replica; the advertised endpoints."""

from types import SimpleNamespace

from strata.cluster.read_replicas import NO_READ_REPLICAS


def no_metadata() -> SimpleNamespace:
    return SimpleNamespace(read_replicas=NO_READ_REPLICAS, advertised_endpoints={})
