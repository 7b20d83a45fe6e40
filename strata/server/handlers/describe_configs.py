"""DescribeConfigs v1-4: topic configs (with sources and synonyms), this broker's configs
(static, and the dynamic ones with their DYNAMIC_* sources), the cluster-wide dynamic broker
defaults (resource name ""), and the loggers."""

from __future__ import annotations

from strata.cluster.metadata import ConfigEntry, ConfigEntryType, ConfigSource
from strata.common.errors import ErrorCode, KafkaError
from strata.protocol.codec import kio_error_code, make, response_class
from strata.server import loggers
from strata.security.authorizer import AclOperation
from strata.server.handlers.admin_common import (
    ConfigResourceType as R, attempt, broker_resource_is_this_node, config_denials, resource_type)


def _logger_entries(ctx, name: str) -> list[ConfigEntry]:
    if not broker_resource_is_this_node(ctx, name):
        raise KafkaError("Broker id must not be empty", code=ErrorCode.INVALID_REQUEST)
    return [ConfigEntry(name=n, value=level, read_only=False,
                        source=ConfigSource.DYNAMIC_BROKER_LOGGER_CONFIG, is_sensitive=False,
                        synonyms=[], config_type=ConfigEntryType.STRING, documentation=None)
            for n, level in loggers.levels().items()]


def _entries(ctx, res, synonyms: bool, docs: bool) -> list[ConfigEntry]:
    keys = res.configuration_keys
    kind = resource_type(res.resource_type)
    if kind is R.TOPIC:
        return ctx.metadata.describe_topic_configs(res.resource_name, keys, synonyms, docs)
    if kind is R.BROKER:
        if not broker_resource_is_this_node(ctx, res.resource_name):
            # the cluster-wide default resource: only its dynamic configs
            return ctx.metadata.describe_default_broker_configs(keys, synonyms, docs)
        return ctx.metadata.describe_broker_configs(keys, synonyms, docs)
    if kind is R.BROKER_LOGGER:
        entries = _logger_entries(ctx, res.resource_name)
        return [e for e in entries if not keys or e.name in keys]
    raise KafkaError(f"Unsupported resource type: {kind.name if kind else res.resource_type}",
                     code=ErrorCode.INVALID_REQUEST)


async def handle(ctx, request):
    body = request.body
    rc = response_class(request.api_key, request.api_version)
    synonyms = getattr(body, "include_synonyms", False)
    docs = getattr(body, "include_documentation", False)
    denials = config_denials(ctx, AclOperation.DESCRIBE_CONFIGS,
                             ((r.resource_type, r.resource_name) for r in body.resources))
    results = []
    for res in body.resources:
        denial = denials.get((res.resource_type, res.resource_name))
        if denial is not None:
            entries, (code, message) = (), denial
        else:
            entries, code, message = attempt(lambda: _entries(ctx, res, synonyms, docs))
        configs = tuple(
            make(rc, "results.configs", name=e.name, value=e.value, read_only=e.read_only,
                 config_source=int(e.source), is_sensitive=e.is_sensitive,
                 synonyms=tuple(make(rc, "results.configs.synonyms", name=s.name, value=s.value,
                                     source=int(s.source)) for s in e.synonyms),
                 config_type=int(e.config_type), documentation=e.documentation)
            for e in entries or ())
        results.append(make(rc, "results", error_code=kio_error_code(code), error_message=message,
                            resource_type=res.resource_type, resource_name=res.resource_name,
                            configs=configs))
    return make(rc, results=tuple(results))
