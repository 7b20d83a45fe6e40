#!/bin/sh
# Regenerates strata/common/kafka_broker_configs.py from a Kafka distribution's jars
# (make kafka-dist puts them under .cache/kafka/<version>/libs). Needs a JDK.
set -eu
cd "$(dirname "$0")/.."
VERSION="${1:-4.4.0}"
CP=".cache/kafka/$VERSION/libs/*"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
javac -d "$TMP" -cp "$CP" scripts/gen/KafkaBrokerConfigs.java
java -cp "$CP:$TMP" KafkaBrokerConfigs > "$TMP/configs.tsv"
.venv/bin/python - "$TMP/configs.tsv" "$VERSION" <<'PY'
import sys
rows = [line.rstrip("\n").split("\t") for line in open(sys.argv[1])]
out = ['"""Kafka\'s broker configs (``KafkaConfig.configDef()``): name to (type, internal,',
       f'validator as Kafka prints it). Generated from kafka_2.13-{sys.argv[2]} with',
       '``scripts/gen_kafka_broker_configs.sh``; do not edit by hand. Used to type broker',
       'configs Strata does not define itself (DescribeConfigs, the start-up checks)."""',
       '', 'from __future__ import annotations', '',
       'KAFKA_BROKER_CONFIGS: dict[str, tuple[str, bool, str]] = {']
for name, typ, internal, validator in rows:
    out.append(f"    {name!r}: ({typ!r}, {internal == 'internal'}, {validator!r}),")
out.append("}")
open("strata/common/kafka_broker_configs.py", "w").write("\n".join(out) + "\n")
PY
