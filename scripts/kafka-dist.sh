#!/usr/bin/env bash
# Install the Apache Kafka 4.x jars (broker/core + CLI tools + storage test jar +
# Kafka Streams and its examples) from Maven Central into an ignored cache dir, for
# running Kafka's own tools (DumpLogSegments, perf tests, GetOffsetShell, ...) and
# Streams applications (WordCountDemo) against strata.
#
#   scripts/kafka-dist.sh            -> prints the libs dir as the last stdout line
#
# Environment:
#   KAFKA_VERSION     Kafka release to install (default below).
#   KAFKA_CACHE_DIR   cache root (default: <repo>/.cache/kafka); the install
#                     goes to $KAFKA_CACHE_DIR/$KAFKA_VERSION/{libs,log4j2.properties}
#   MVN               maven executable (default: mvn)
#
# Exit codes: 0 ok, 3 java or mvn missing, anything else: maven failed.
#
# kafka-streams-examples (WordCountDemo, used by the Streams tests) is published up to 4.3.x
# only: for a later KAFKA_VERSION the 4.3.1 examples jar alone (no dependencies of its own) runs
# on that version's kafka-streams.
set -euo pipefail

KAFKA_VERSION="${KAFKA_VERSION:-4.4.0}"
# log4j2 backend for the tools. Kafka 4.x ships log4j-core + log4j-slf4j-impl
# (the slf4j 1.x binding, since kafka depends on slf4j-api 1.7.36); the
# slf4j2 binding is not picked up by slf4j 1.7.
LOG4J_VERSION="${KAFKA_LOG4J_VERSION:-2.24.3}"
# Bump when the artifact list / layout below changes, so old caches reinstall.
LAYOUT_REV="4"
EXAMPLES="kafka-streams-examples"
# LocalTieredStorage: in kafka-storage's jar of classifier "test" (not the test-jar type's
# "tests") up to 4.3; from 4.4 in its test fixtures' jar, classifier "test-fixtures".
case "$KAFKA_VERSION" in
    4.[0-3].*) EXAMPLES_VERSION="$KAFKA_VERSION"; RSM_CLASSIFIER="test" ;;
    *) EXAMPLES_VERSION="4.3.1"; RSM_CLASSIFIER="test-fixtures" ;;
esac

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$SCRIPT_DIR/.." && pwd)"
source "$SCRIPT_DIR/maven-dist-lib.sh"

MD_NAME="kafka-dist.sh"
DIST_DIR="${KAFKA_CACHE_DIR:-$REPO_ROOT/.cache/kafka}/$KAFKA_VERSION"
OUT_DIR="$DIST_DIR/libs"
MD_STAMP="kafka=$KAFKA_VERSION examples=$EXAMPLES_VERSION log4j=$LOG4J_VERSION layout=$LAYOUT_REV"
md_complete() { [[ -d "$OUT_DIR" && -f "$DIST_DIR/log4j2.properties" ]]; }

md_require_tools "need a JDK/JRE 17+ to run Kafka $KAFKA_VERSION tools"
md_begin

md_pom kafka-dist "$KAFKA_VERSION" "$(
    md_dep org.apache.kafka kafka_2.13 "$KAFKA_VERSION"    # kafka.Kafka
    md_dep org.apache.kafka kafka-tools "$KAFKA_VERSION"   # org.apache.kafka.tools.* CLI tools
    md_dep org.apache.kafka kafka-storage "$KAFKA_VERSION"
    md_dep org.apache.kafka kafka-storage "$KAFKA_VERSION" "<classifier>$RSM_CLASSIFIER</classifier>"
    md_dep org.apache.kafka kafka-server-common "$KAFKA_VERSION"
    md_dep org.apache.kafka kafka-clients "$KAFKA_VERSION"
    # Kafka Streams (brings rocksdbjni, whose jar carries the native libs for Linux/macOS/
    # Windows) and its examples jar (org.apache.kafka.streams.examples.wordcount.WordCountDemo).
    md_dep org.apache.kafka kafka-streams "$KAFKA_VERSION"
    md_dep org.apache.kafka "$EXAMPLES" "$EXAMPLES_VERSION" \
        '<exclusions><exclusion><groupId>*</groupId><artifactId>*</artifactId></exclusion></exclusions>'
    md_dep org.apache.logging.log4j log4j-api "$LOG4J_VERSION"
    md_dep org.apache.logging.log4j log4j-core "$LOG4J_VERSION"
    md_dep org.apache.logging.log4j log4j-slf4j-impl "$LOG4J_VERSION"
)" >"$WORK/pom.xml"

cat >"$WORK/log4j2.properties" <<'EOF'
# Quiet config for Kafka tools run from strata tests: WARN and above to stderr.
status = error
name = strata-kafka-tools
appender.stderr.type = Console
appender.stderr.name = STDERR
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.stderr.ref = STDERR
EOF

md_fetch libs

# Some 4.x poms (e.g. kafka-server-common 4.4.0) declare mockito/junit at
# runtime scope; useless for the tools, drop them if they show up.
rm -f "$WORK"/libs/mockito-*.jar "$WORK"/libs/junit-*.jar "$WORK"/libs/opentest4j-*.jar \
      "$WORK"/libs/apiguardian-*.jar "$WORK"/libs/byte-buddy-*.jar "$WORK"/libs/objenesis-*.jar

for must in "kafka_2.13-$KAFKA_VERSION.jar" "kafka-tools-$KAFKA_VERSION.jar" \
            "kafka-storage-$KAFKA_VERSION-$RSM_CLASSIFIER.jar" "kafka-server-common-$KAFKA_VERSION.jar" \
            "kafka-streams-$KAFKA_VERSION.jar" "$EXAMPLES-$EXAMPLES_VERSION.jar"; do
    [[ -f "$WORK/libs/$must" ]] || md_die 1 "expected $must in the maven output, not found"
done

md_commit libs log4j2.properties
