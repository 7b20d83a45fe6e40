"""The cluster metadata of a handler test that asks nothing of it but what every handler reads:
no topic is a remote read replica."""

from types import SimpleNamespace

from strata.cluster.read_replicas import NO_READ_REPLICAS

NO_METADATA = SimpleNamespace(read_replicas=NO_READ_REPLICAS)
