#!/usr/bin/env bash
# Run a main class from the Maven-installed Kafka distribution:
#
#   scripts/kafka-run-class.sh org.apache.kafka.tools.DumpLogSegments --files 0.log
#
# Installs the jars first if needed (scripts/kafka-dist.sh; same env vars:
# KAFKA_VERSION, KAFKA_CACHE_DIR). Extra JVM options:
#   KAFKA_HEAP_OPTS   default -Xmx512m
#   KAFKA_JVM_OPTS    extra JVM flags (e.g. -XX:TieredStopAtLevel=1 for faster startup)
#   KAFKA_LOG4J_CONFIG  log4j2 config file (default: the quiet WARN-to-stderr one
#                       written next to libs/ by kafka-dist.sh)
# Exit codes: 2 usage, 3 java/mvn missing, otherwise the class's exit code.
set -euo pipefail

if [[ $# -lt 1 ]]; then
    echo "usage: $(basename "$0") MAIN_CLASS [ARGS...]" >&2
    exit 2
fi

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# Last stdout line of kafka-dist.sh is the libs dir (exit status propagates via set -e).
dist_out="$("$SCRIPT_DIR/kafka-dist.sh")"
LIBS_DIR="${dist_out##*$'\n'}"
DIST_DIR="$(dirname "$LIBS_DIR")"
LOG4J_CONFIG="${KAFKA_LOG4J_CONFIG:-$DIST_DIR/log4j2.properties}"

main_class="$1"
shift

# shellcheck disable=SC2086  # the *_OPTS variables are word-split on purpose
exec java ${KAFKA_HEAP_OPTS:--Xmx512m} ${KAFKA_JVM_OPTS:-} \
    -Dlog4j2.configurationFile="$LOG4J_CONFIG" \
    -cp "$LIBS_DIR/*" \
    "$main_class" "$@"
