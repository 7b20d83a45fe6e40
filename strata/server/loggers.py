"""The broker's loggers as Kafka's BROKER_LOGGER config resource: describe and set levels.

Kafka names levels the log4j way; Python's WARNING and CRITICAL are shown as WARN and FATAL."""

from __future__ import annotations

import logging

from strata.common.errors import ErrorCode, KafkaError

ROOT = "root"
_TO_KAFKA = {"WARNING": "WARN", "CRITICAL": "FATAL", "NOTSET": "INFO"}
_FROM_KAFKA = {"TRACE": logging.DEBUG, "DEBUG": logging.DEBUG, "INFO": logging.INFO,
               "WARN": logging.WARNING, "ERROR": logging.ERROR, "FATAL": logging.CRITICAL,
               "OFF": logging.CRITICAL + 10}
OP_SET, OP_DELETE = 0, 1


def _logger(name: str) -> logging.Logger | None:
    if name == ROOT:
        return logging.getLogger()
    existing = logging.Logger.manager.loggerDict.get(name)
    return existing if isinstance(existing, logging.Logger) else None


def _level_name(logger: logging.Logger) -> str:
    name = logging.getLevelName(logger.getEffectiveLevel())
    return _TO_KAFKA.get(name, name)


def levels() -> dict[str, str]:
    """Every logger's effective level, the root logger as ``root``."""
    names = [n for n, v in logging.Logger.manager.loggerDict.items() if isinstance(v, logging.Logger)]
    out = {ROOT: _level_name(logging.getLogger())}
    for name in sorted(names):
        out[name] = _level_name(logging.getLogger(name))
    return out


def alter(ops: list[tuple[str, int, str | None]], validate_only: bool) -> None:
    """IncrementalAlterConfigs on BROKER_LOGGER: SET a level or DELETE (back to inherited)."""
    changes: list[tuple[logging.Logger, int]] = []
    for name, op, value in ops:
        logger = _logger(name)
        if logger is None:
            raise KafkaError(f"Logger {name} does not exist!", code=ErrorCode.INVALID_CONFIG)
        if op == OP_SET:
            level = _FROM_KAFKA.get((value or "").upper())
            if level is None:
                raise KafkaError(f"Cannot set the log level of {name} to {value} as it is not a "
                                 f"supported log level. Valid log4j levels are "
                                 f"{', '.join(_FROM_KAFKA)}", code=ErrorCode.INVALID_CONFIG)
            changes.append((logger, level))
        elif op == OP_DELETE:
            if name == ROOT:
                raise KafkaError("Removing the log level of the root logger is not allowed",
                                 code=ErrorCode.INVALID_REQUEST)
            changes.append((logger, logging.NOTSET))
        else:
            raise KafkaError(f"Operation {op} is not allowed for the BROKER_LOGGER resource",
                             code=ErrorCode.INVALID_REQUEST)
    if not validate_only:
        for logger, level in changes:
            logger.setLevel(level)
