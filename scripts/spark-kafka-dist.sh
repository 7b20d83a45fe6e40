#!/usr/bin/env bash
# Install Spark's own Kafka connector (spark-sql-kafka-0-10 for the installed PySpark) and the
# runtime jars it needs that PySpark does not already ship, from Maven Central into an ignored
# cache dir. Spark sessions put them on their classpath with `spark.jars`.
#
#   scripts/spark-kafka-dist.sh      -> prints the jars dir as the last stdout line
#
# Environment:
#   PYTHON                 the python whose pyspark is used (default: <repo>/.venv/bin/python)
#   SPARK_VERSION          connector version (default: that pyspark's version)
#   SPARK_KAFKA_CACHE_DIR  cache root (default: <repo>/.cache/spark-kafka); the install goes to
#                          $SPARK_KAFKA_CACHE_DIR/$SPARK_VERSION/jars
#   MVN                    maven executable (default: mvn)
#
# Exit codes: 0 ok, 3 java or mvn missing, 4 pyspark not importable, anything else: maven failed.
#
# Only Spark 4.0.x resolves completely on Maven Central here: 4.1+ lacks
# spark-token-provider-kafka-0-10, a dependency of the connector.
set -euo pipefail

SCALA_BINARY="2.13"
# Bump when the artifact list / layout below changes, so old caches reinstall.
LAYOUT_REV="1"

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$SCRIPT_DIR/.." && pwd)"
PYTHON="${PYTHON:-$REPO_ROOT/.venv/bin/python}"
source "$SCRIPT_DIR/maven-dist-lib.sh"
MD_NAME="spark-kafka-dist.sh"

md_require_tools "Spark needs a JDK/JRE 17+"

# pyspark's version and its bundled jars dir, in one interpreter start.
pyspark_info="$("$PYTHON" -c 'import os, pyspark
print(pyspark.__version__)
print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))' 2>/dev/null)" \
    || md_die 4 "pyspark is not importable with $PYTHON (run make venv first)"
PYSPARK_VERSION="$(sed -n 1p <<<"$pyspark_info")"
PYSPARK_JARS="$(sed -n 2p <<<"$pyspark_info")"
[[ -d "$PYSPARK_JARS" ]] || md_die 4 "pyspark at $PYTHON has no jars dir ($PYSPARK_JARS)"

SPARK_VERSION="${SPARK_VERSION:-$PYSPARK_VERSION}"
CONNECTOR="spark-sql-kafka-0-10_$SCALA_BINARY"
DIST_DIR="${SPARK_KAFKA_CACHE_DIR:-$REPO_ROOT/.cache/spark-kafka}/$SPARK_VERSION"
OUT_DIR="$DIST_DIR/jars"
MD_STAMP="spark=$SPARK_VERSION scala=$SCALA_BINARY pyspark=$PYSPARK_VERSION layout=$LAYOUT_REV"
md_complete() { [[ -f "$OUT_DIR/$CONNECTOR-$SPARK_VERSION.jar" ]]; }

md_begin
md_pom spark-kafka-dist "$SPARK_VERSION" \
    "$(md_dep org.apache.spark "$CONNECTOR" "$SPARK_VERSION")" >"$WORK/pom.xml"
# The repository layout (group/artifact/version/file.jar) names each jar's artifactId exactly.
md_fetch repo -Dmdep.useRepositoryLayout=true

# Keep only the artifacts PySpark does not ship in any version (Scala, slf4j, Hadoop's client,
# snappy, lz4, spark-tags... are already on its classpath; a second copy would clash).
mkdir -p "$WORK/jars"
while IFS= read -r jar; do
    artifact="$(basename "$(dirname "$(dirname "$jar")")")"
    if compgen -G "$PYSPARK_JARS/$artifact-[0-9]*.jar" >/dev/null; then
        continue
    fi
    cp "$jar" "$WORK/jars/"
done < <(find "$WORK/repo" -name '*.jar' | sort)

for must in "$CONNECTOR-$SPARK_VERSION.jar" \
            "spark-token-provider-kafka-0-10_$SCALA_BINARY-$SPARK_VERSION.jar"; do
    [[ -f "$WORK/jars/$must" ]] || md_die 1 "expected $must in the maven output, not found"
done
compgen -G "$WORK/jars/kafka-clients-*.jar" >/dev/null \
    || md_die 1 "expected kafka-clients in the maven output, not found"

md_commit jars
