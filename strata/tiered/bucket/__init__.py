"""The self-describing bucket (issue 52): per-partition manifests of the remote segments, per-topic
manifests, the cluster marker that says which cluster owns a key prefix, and topic recovery
from them. The format is documented in docs/remote-manifests.md."""
